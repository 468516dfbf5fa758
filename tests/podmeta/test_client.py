"""KubeClient against a real HTTPS server on 127.0.0.1 (CA-verified, IP SAN)."""

from __future__ import annotations

from pathlib import Path

import pytest
from podmeta_api import NODE, Answer, FakeApi, pod_list, status_body, write_token_dir

from agent.discover.podmeta import ApiEndpoint, KubeApiError, KubeClient, endpoint_from_env
from perfbalance.errors import ParseError

WEB_UID = "3f2b6c1e-8a4d-4b7e-9c15-2d6e0a1b7f93"


def test_lists_this_nodes_pods_from_the_watch_cache(api: FakeApi, client: KubeClient):
    got = client.list_node_pods(NODE)
    (seen,) = api.seen
    assert seen.path == "/api/v1/pods"
    assert seen.query == {"fieldSelector": [f"spec.nodeName={NODE}"], "resourceVersion": ["0"]}
    assert len({p.uid for p in got.pods.values()}) == 4
    assert got.pods[WEB_UID].name == "web-7d9f8b6c5-x2k4p"
    assert got.resource_version == "884700"


def test_sends_the_bearer_token(api: FakeApi, client: KubeClient):
    client.list_node_pods(NODE)
    assert api.seen[0].headers["authorization"] == "Bearer token-one"
    assert api.seen[0].headers["accept"] == "application/json"


def test_rotated_token_is_read_again(api: FakeApi, client: KubeClient, token_file: Path):
    client.list_node_pods(NODE)
    write_token_dir(token_file.parent, "token-two\n")  # kubelet swaps ..data
    client.list_node_pods(NODE)
    assert [s.headers["authorization"] for s in api.seen] == ["Bearer token-one", "Bearer token-two"]


def test_unchanged_token_file_is_not_read_every_request(api: FakeApi, client: KubeClient):
    for _ in range(3):
        client.list_node_pods(NODE)
    assert client._token.reads == 1


def test_server_error_names_url_and_status(api: FakeApi, client: KubeClient):
    api.answer = Answer(status=500, body=status_body(500, "InternalError", "etcdserver: request timed out"))
    with pytest.raises(KubeApiError) as e:
        client.list_node_pods(NODE)
    assert e.value.status == 500
    assert f"https://127.0.0.1:{api.port}/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}" in str(e.value)
    assert "HTTP 500" in str(e.value) and "etcdserver: request timed out" in str(e.value)


def test_forbidden_says_what_rbac_refused(api: FakeApi, client: KubeClient):
    msg = ('pods is forbidden: User "system:serviceaccount:perfbalance:perfbalance" cannot list '
           'resource "pods" in API group "" at the cluster scope')
    api.answer = Answer(status=403, body=status_body(403, "Forbidden", msg))
    with pytest.raises(KubeApiError, match=r"HTTP 403 pods is forbidden: User .*cannot list"):
        client.list_node_pods(NODE)


def test_timeout_is_a_clear_error(api: FakeApi, token_file: Path):
    api.answer = Answer(body=pod_list(), delay=5.0)
    c = KubeClient(endpoint=api.endpoint, token_file=str(token_file), ca_file=str(api.ca_file),
                   timeout_seconds=0.3)
    with pytest.raises(KubeApiError, match=r"no answer within 0.3 s"):
        c.list_node_pods(NODE)


def test_trickling_body_is_cut_by_the_overall_deadline(api: FakeApi, token_file: Path):
    api.answer = Answer(body=pod_list(), chunked=True, trickle=0.05)  # ~15 chunks: > 0.3 s in total
    c = KubeClient(endpoint=api.endpoint, token_file=str(token_file), ca_file=str(api.ca_file),
                   timeout_seconds=0.3)
    with pytest.raises(KubeApiError, match=r"response not complete within 0.3 s"):
        c.list_node_pods(NODE)


def test_garbage_json_is_a_clear_error(api: FakeApi, client: KubeClient):
    api.answer = Answer(body=b"<html><body>502 Bad Gateway</body></html>")
    with pytest.raises(KubeApiError, match=r"/api/v1/pods.*unusable answer: not JSON"):
        client.list_node_pods(NODE)


def test_json_that_is_not_a_pod_list_is_a_clear_error(api: FakeApi, client: KubeClient):
    api.answer = Answer(body=b'{"kind": "Status", "items": "nope"}')
    with pytest.raises(KubeApiError, match=r"not a PodList"):
        client.list_node_pods(NODE)


def test_oversized_body_with_content_length_is_refused(api: FakeApi, token_file: Path):
    c = KubeClient(endpoint=api.endpoint, token_file=str(token_file), ca_file=str(api.ca_file),
                   max_response_bytes=2048)
    with pytest.raises(KubeApiError, match=r"response of \d+ bytes exceeds the limit of 2048 bytes"):
        c.list_node_pods(NODE)


def test_oversized_chunked_body_is_refused(api: FakeApi, token_file: Path):
    api.answer = Answer(body=pod_list(), chunked=True)
    c = KubeClient(endpoint=api.endpoint, token_file=str(token_file), ca_file=str(api.ca_file),
                   max_response_bytes=2048)
    with pytest.raises(KubeApiError, match=r"response exceeds the limit of 2048 bytes"):
        c.list_node_pods(NODE)


def test_chunked_body_within_limit_is_read(api: FakeApi, client: KubeClient):
    api.answer = Answer(body=pod_list(), chunked=True)
    assert WEB_UID in client.list_node_pods(NODE).pods


def test_server_not_signed_by_the_configured_ca_is_refused(api: FakeApi, token_file: Path, tmp_path: Path):
    other = tmp_path / "other-ca.crt"
    other.write_text(Path(api.ca_file.parent / "server.crt").read_text())  # a cert, but not the CA
    c = KubeClient(endpoint=api.endpoint, token_file=str(token_file), ca_file=str(other))
    with pytest.raises(KubeApiError, match=r"TLS failed"):
        c.list_node_pods(NODE)


def test_missing_token_file_names_the_file(api: FakeApi, tmp_path: Path):
    c = KubeClient(endpoint=api.endpoint, token_file=str(tmp_path / "nope"), ca_file=str(api.ca_file))
    with pytest.raises(KubeApiError, match=r"nope.*cannot read service-account token"):
        c.list_node_pods(NODE)
    assert api.seen == []


def test_connection_refused_names_the_url(token_file: Path, certs):
    c = KubeClient(endpoint=ApiEndpoint(host="127.0.0.1", port=1), token_file=str(token_file),
                   ca_file=str(certs["ca"]))
    with pytest.raises(KubeApiError, match=r"https://127.0.0.1:1/api/v1/pods.*request failed"):
        c.list_node_pods(NODE)


def test_endpoint_from_env():
    assert endpoint_from_env({}) is None
    assert endpoint_from_env({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == ApiEndpoint(host="10.96.0.1", port=443)
    ep = endpoint_from_env({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert ep is not None and ep.base_url == "https://[fd00::1]:6443"


@pytest.mark.parametrize("env", [{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "https"},
                                 {"KUBERNETES_SERVICE_HOST": "evil/host?x", "KUBERNETES_SERVICE_PORT": "443"}])
def test_bad_in_cluster_env_is_a_parse_error(env):
    with pytest.raises(ParseError, match="KUBERNETES_SERVICE_"):
        endpoint_from_env(env)
