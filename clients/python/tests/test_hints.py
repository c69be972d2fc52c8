"""What the client adds to a failure whose gRPC words do not say what to do."""

import grpc

from gpu_attest_client.errors import _hint

API = "http://127.0.0.1:7071"


def test_nothing_listening_at_the_api_is_named_as_such():
    details = ("failed to connect to all addresses; last error: UNAVAILABLE: "
               "ipv4:127.0.0.1:7071: Connection refused")
    hint = _hint(grpc.StatusCode.UNAVAILABLE, details, API)
    assert hint.startswith(f"nothing listens at {API}"), hint


def test_a_validator_that_could_not_reach_a_miner_is_not_sent_to_its_own_host():
    # The validator's own message, passed on: the miner refused, not the validator.
    details = ("cannot reach the miner at http://10.0.0.5:7070: transport error: "
               "tcp connect error: Connection refused (os error 111)")
    assert _hint(grpc.StatusCode.UNAVAILABLE, details, API) == ""
