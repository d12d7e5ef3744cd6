"""The scripted oracle: the shortest action sequence from any state to the goal.

For a `set` goal every field whose value differs from its target needs one click (a checkbox or
toggle) or a click and a `type` (a text field; just the `type` when it is already focused), a
field on another screen needs that screen's tab first (one click per screen visited; the shown
screen's fields are done first, then the other screens in order), and Save one click, unless the
saved state already is the target. Cancel (one click) puts every field back to the saved or
initial values; the oracle takes it when that makes the rest shorter. So the plan is a shortest
one: each pending field, screen change and Save is needed, and nothing else is done. For a
`press` goal it is one click on the target (none once pressed; a wrong press cannot be undone
and the plan is then just to stop, as it is whenever the goal cannot be reached any more). `stop` ends the plan when the
env requires it.

Clicks go to a widget's box centre (`Widget.centre`). Generated apps have a tab to every screen on
every screen; a hand-written app may link its screens otherwise, and the oracle then follows the
fewest tabs to each screen in turn (`App.route`): a valid plan, shortest per screen visited but
not necessarily overall.
"""

from __future__ import annotations

from vlrl.envs.gui.actions import Action
from vlrl.envs.gui.app import App, AppState, Widget, goal_holds


def _click(widget: Widget) -> Action:
    x, y = widget.centre()
    return Action("click", x, y)


def _fix_fields(app: App, state: AppState) -> list[Action] | None:
    """Set every field to its target value and save; no stop. None when the tabs cannot get there
    (a hand-written app whose screens do not all link back)."""
    wanted = app.target_values()
    pending = [w for w in app.fields() if state.values[w.id] != wanted[w.id]]
    if not pending and state.saved == wanted:
        return []
    screens = sorted({app.screen_of(w.id) for w in pending}, key=lambda s: (s != state.screen, s))
    actions: list[Action] = []
    screen, focus = state.screen, state.focus
    for s in screens:
        if s != screen:
            route = app.route(screen, s)
            if route is None:
                return None
            actions += [_click(tab) for tab in route]
            screen, focus = s, None
        for w in (w for w in pending if app.screen_of(w.id) == s):
            if w.kind == "textfield":
                if focus != w.id:
                    actions.append(_click(w))
                actions.append(Action("type", text=str(wanted[w.id])))
                focus = w.id
            else:
                actions.append(_click(w))
    if not app.buttons(screen, "save"):  # hand-written apps: go to the nearest screen with Save
        routes = [
            r for s in range(len(app.screens)) if app.buttons(s, "save") and (r := app.route(screen, s)) is not None
        ]
        if not routes:
            return None
        route = min(routes, key=len)
        actions += [_click(tab) for tab in route]
        screen = route[-1].target  # type: ignore[assignment]
    actions.append(_click(app.buttons(screen, "save")[0]))
    return actions


def plan(app: App, state: AppState, stop_required: bool = True) -> list[Action]:
    """The shortest action list from `state` that ends with the goal holding (and `stop` if required)."""
    stop = [Action("stop")] if stop_required else []
    if goal_holds(app, state):
        return [Action("stop")]
    if "press" in app.goal:
        if state.pressed:  # a wrong press cannot be undone
            return [Action("stop")]
        target = app.goal["press"]
        route = app.route(state.screen, app.screen_of(target))
        if route is None:
            return [Action("stop")]
        return [_click(tab) for tab in route] + [_click(app.widget(target))] + stop
    candidates = [_fix_fields(app, state)]
    cancel = app.buttons(state.screen, "cancel")
    if cancel:
        after = state.copy()
        after.values = dict(state.saved if state.saved is not None else app.initial_values())
        after.focus = None
        rest = _fix_fields(app, after)
        candidates.append(None if rest is None else [_click(cancel[0])] + rest)
    plans = [c for c in candidates if c is not None]
    if not plans:  # the goal cannot be reached from here
        return [Action("stop")]
    return min(plans, key=len) + stop


def optimal_turns(app: App, stop_required: bool = True) -> int:
    """Turns of optimal play from the app's initial state."""
    return len(plan(app, AppState.initial(app), stop_required))
