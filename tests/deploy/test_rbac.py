"""deploy/k8s/rbac.yaml: who may create RayJobs and who may change what the endpoint serves.

No API server runs here, so the Roles are evaluated the way Kubernetes' RBAC authorizer does
(a request is allowed when some rule of a bound Role matches its API group, resource, verb and,
where the rule names them, the object's name) and checked against the separation the project
promises (docs/security.md): the trainer cannot touch the serving Deployment, its ConfigMap or
Secrets; the serving operator cannot create RayJobs; nobody reads Secrets or edits RBAC.
"""

from __future__ import annotations

import pytest
from deploy_helpers import K8S, load_yaml_docs, objects_of_kind, only

RBAC = "rbac.authorization.k8s.io"
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
WRITE = VERBS - {"get", "list", "watch"}


def role(name: str) -> dict:
    (found,) = [doc for _, doc in objects_of_kind("Role") if doc["metadata"]["name"] == name]
    return found


def allowed(role_name: str, verb: str, group: str, resource: str, name: str | None = None) -> bool:
    """Kubernetes RBAC's decision for one request by a subject bound to this Role."""
    for rule in role(role_name)["rules"]:
        if group not in rule["apiGroups"] or resource not in rule["resources"] or verb not in rule["verbs"]:
            continue
        if "resourceNames" in rule and name not in rule["resourceNames"]:
            continue
        return True
    return False


def test_rbac_objects_are_well_formed():
    docs = load_yaml_docs(K8S / "rbac.yaml")
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding"}
    for doc in docs:
        expected = "v1" if doc["kind"] == "ServiceAccount" else f"{RBAC}/v1"
        assert doc["apiVersion"] == expected, doc["metadata"]["name"]
    for _, r in objects_of_kind("Role"):
        for rule in r["rules"]:
            assert rule["apiGroups"] and rule["resources"] and rule["verbs"], rule
            assert set(rule["verbs"]) <= VERBS, rule  # no wildcards, no escalate/bind/impersonate
            assert "*" not in rule["apiGroups"] + rule["resources"], rule


def test_bindings_reference_existing_roles_and_service_accounts():
    roles = {doc["metadata"]["name"] for _, doc in objects_of_kind("Role")}
    accounts = {doc["metadata"]["name"] for _, doc in objects_of_kind("ServiceAccount")}
    bound = set()
    for _, binding in objects_of_kind("RoleBinding"):
        ref = binding["roleRef"]
        assert (ref["apiGroup"], ref["kind"]) == (RBAC, "Role") and ref["name"] in roles, ref
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["name"] in accounts, subject
            assert subject["namespace"] == binding["metadata"]["namespace"] == "vlrl"
        bound.add(ref["name"])
    assert bound == roles == {"vlrl-trainer", "vlrl-serving-operator", "vlrl-viewer"}


def test_the_trainer_submits_rayjobs_and_cannot_change_serving():
    assert allowed("vlrl-trainer", "create", "ray.io", "rayjobs")
    assert allowed("vlrl-trainer", "delete", "ray.io", "rayjobs")
    serving = only("Deployment")["metadata"]["name"]
    for verb in WRITE:
        assert not allowed("vlrl-trainer", verb, "apps", "deployments", serving), verb
        assert not allowed("vlrl-trainer", verb, "", "configmaps", "vlrl-serve-roles"), verb
        assert not allowed("vlrl-trainer", verb, "", "secrets", "vlrl-serve-tokens"), verb
        assert not allowed("vlrl-trainer", verb, "ray.io", "rayclusters"), verb  # the cluster is the operators'


def test_the_serving_operator_changes_serving_and_cannot_submit_training():
    deployment = only("Deployment")
    assert allowed("vlrl-serving-operator", "patch", "apps", "deployments", deployment["metadata"]["name"])
    assert not allowed("vlrl-serving-operator", "patch", "apps", "deployments", "some-other-deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    roles_map, tokens = volumes["roles"]["configMap"]["name"], volumes["tokens"]["secret"]["secretName"]
    assert roles_map == only("ConfigMap")["metadata"]["name"]
    assert allowed("vlrl-serving-operator", "patch", "", "configmaps", roles_map)
    assert allowed("vlrl-serving-operator", "update", "", "secrets", tokens)  # rotate tokens...
    for verb in WRITE:
        assert not allowed("vlrl-serving-operator", verb, "ray.io", "rayjobs"), verb
        assert not allowed("vlrl-serving-operator", verb, "ray.io", "rayclusters"), verb


@pytest.mark.parametrize("name", ["vlrl-trainer", "vlrl-serving-operator", "vlrl-viewer"])
def test_no_role_reads_secrets_or_edits_rbac(name):
    for verb in ("get", "list", "watch"):  # ...but nobody reads them back: a token read is an identity taken
        assert not allowed(name, verb, "", "secrets", "vlrl-serve-tokens") and not allowed(name, verb, "", "secrets")
    for resource in ("roles", "rolebindings"):
        for verb in VERBS:
            assert not allowed(name, verb, RBAC, resource), (resource, verb)
    for verb in ("create",):
        assert not allowed(name, verb, "", "pods/exec"), "exec into a pod reads its mounted Secrets"


def test_the_viewer_only_reads():
    for r in role("vlrl-viewer")["rules"]:
        assert set(r["verbs"]) <= {"get", "list", "watch"}, r
