"""The tenant table: names -> codes and weights, labels, and the `tenants` option's errors."""

from __future__ import annotations

import pytest

from fairway.errors import FairwayConfigError
from fairway.options import FairwayOptions
from fairway.tenants import DEFAULT_TENANT, OTHER_LABEL, TenantTable


def test_codes_weights_and_labels() -> None:
    table = TenantTable.parse({"team-a": 2, "team-b": 1, "default": 0.5})
    assert table.enabled
    assert table.names == ("default", "team-a", "team-b")
    assert table.code_weights == (0.5, 2.0, 1.0)
    assert [table.code_of(n) for n in ("team-a", "team-b", None, "unknown", 7)] == [1, 2, 0, 0, 0]
    assert table.label_of("team-b") == "team-b"
    assert table.label_of(None) == table.label_of("") == DEFAULT_TENANT
    assert table.label_of("someone-else") == OTHER_LABEL  # unknown: the default's share
    assert table.labels() == ("default", "team-a", "team-b", "other")


def test_a_list_of_names_weighs_one_each_and_none_is_off() -> None:
    assert TenantTable.parse(["x", "y"]).code_weights == (1.0, 1.0, 1.0)
    off = TenantTable.parse(None)
    assert not off.enabled and off.code_weights == (1.0,)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": 0}, "weight of tenant 'a' is 0"),
        ({"a": -1}, "weight of tenant 'a' is -1"),
        ({"a": "heavy"}, "weight of tenant 'a' is 'heavy'"),
        ({"a": float("nan")}, "allowed: a finite number > 0"),
        ({"other": 1}, "tenant name 'other' is not allowed"),
        ({"": 1}, "tenant name '' is not allowed"),
        ("team-a", "allowed: a JSON object of tenant name -> weight"),
        ({f"t{i}": 1 for i in range(65)}, "at most 64"),
    ],
)
def test_bad_tenants_stop_start_up_with_the_key_the_value_and_what_is_allowed(
    value: object, message: str
) -> None:
    with pytest.raises(FairwayConfigError, match="option tenants") as info:
        FairwayOptions.resolve({"tenants": value})
    assert message in str(info.value)
    assert "--additional-config fairway.tenants" in str(info.value)  # where it came from


def test_the_option_from_the_environment_is_json() -> None:
    options = FairwayOptions.resolve(None, {"FAIRWAY_TENANTS": '{"a": 3}'})
    assert options.tenant_table.code_weights == (1.0, 3.0)
    assert options.sources["tenants"] == "FAIRWAY_TENANTS"
