"""What `mlxd start` prints once it listens: the real address, the dashboard, a request to try."""

from mlxd.supervisor.ctl.urlfile import client_url
from mlxd.supervisor.daemon import banner

TRY = (
    "  try: curl http://127.0.0.1:9123/v1/chat/completions -H 'content-type: application/json'"
    ' -d \'{"messages": [{"role": "user", "content": "What is the capital of France?"}]}\''
)


def test_the_banner_uses_the_real_address_and_names_the_dashboard():
    lines = banner(client_url("127.0.0.1", 9123), "smollm2-135m-instruct", False, False)
    assert lines.splitlines()[1:] == [
        "  dashboard: http://127.0.0.1:9123/ui",
        "  default model: smollm2-135m-instruct",
        TRY,
    ]
    assert lines.splitlines()[0].endswith(": serving on http://127.0.0.1:9123 (Ctrl-C stops)")


def test_a_first_start_says_the_import_is_under_way():
    text = banner("http://127.0.0.1:9123", "smollm2-135m-instruct", True, False)
    assert "  default model: smollm2-135m-instruct (importing it now, once: progress below" in text


def test_wildcard_and_ipv6_binds_print_an_address_a_client_can_use_and_the_key():
    text = banner(client_url("::1", 8081), "m", False, True)
    assert "  dashboard: http://[::1]:8081/ui" in text
    assert (
        'curl http://[::1]:8081/v1/chat/completions -H "authorization: Bearer $MLXD_API_KEY"'
        in (text)
    )
    assert "http://127.0.0.1:8082/ui" in banner(client_url("0.0.0.0", 8082), "m", False, True)


def test_without_a_default_model_it_says_to_name_one():
    text = banner("http://127.0.0.1:9123", None, False, False)
    assert "curl" not in text and "no default model: name one in each request" in text
