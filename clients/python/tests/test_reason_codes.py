"""The client's reason codes are exactly PROTOCOL.md's (section 16), so a new code cannot be
added to the validator without the client learning it."""

import re
from pathlib import Path

from gpu_attest_client import ReasonCode

PROTOCOL = Path(__file__).resolve().parents[3] / "PROTOCOL.md"


def protocol_codes():
    text = PROTOCOL.read_text()
    section = text[text.index("## 16. Verdict reasons") :]
    section = section[: section.index("\n## 17.")]
    table = section[section.index("| code | meaning |") :]
    table = table[: table.index("\n\n")]
    codes = []
    for row in table.splitlines()[2:]:
        first_column = row.split("|")[1]
        codes += re.findall(r"`([a-z0-9-]+)`", first_column)
    return codes


def test_the_enum_is_the_protocols_table():
    codes = protocol_codes()
    assert len(codes) > 50
    assert len(set(codes)) == len(codes)
    assert sorted(c.value for c in ReasonCode) == sorted(codes)
