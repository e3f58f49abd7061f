"""How the gateway is wired: `harnessrl serve` and `create_app` refuse a bad value by the name of its flag
or argument, before anything is served."""

import pytest

from harnessrl.gateway import create_app
from tests.conftest import ADMIN_KEY, cli


def test_serve_names_the_flag_of_a_bad_value():
    short = cli("serve", "--admin-key", "short")  # refused before any model loads
    assert short.exit_code == 2 and "--admin-key" in short.output and "8 characters" in short.output, short.output
    for flag in ("--max-request-bytes", "--default-max-tokens"):
        refused = cli("serve", "--admin-key", ADMIN_KEY, flag, "0")
        assert refused.exit_code == 2 and flag in refused.output, refused.output
    clash = cli("serve", "--admin-key", ADMIN_KEY, "--frozen", "tiny=tiny-base")  # the policy is "tiny" too
    assert clash.exit_code == 2 and "--frozen" in clash.output and "'tiny'" in clash.output, clash.output


def test_create_app_names_an_argument_out_of_range(policy):
    for argument in ("max_request_bytes", "default_max_tokens"):
        with pytest.raises(ValueError, match=f"{argument} must be at least 1, not 0"):
            create_app(policy, ADMIN_KEY, **{argument: 0})
