from vlrl.cli import main

main()
