"""Schemathesis against the API's own OpenAPI schema, in process: for every operation, generated
valid and invalid requests (with the token) get no 5xx, and every response matches the schema."""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings

from tests.test_web.conftest import AUTH

#: A schema-valid request may still be refused with a 400 that says why (an eta before 1970, an
#: id RQ refuses): the schema cannot express those rules. Never a 5xx. Unknown query parameters
#: are ignored, as HTTP APIs commonly do, so none are generated.
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401", "403", "404", "409", "413"]}
        },
        "generation": {"allow-extra-parameters": False},
        # a periodic entry's crontab and time zone are checked against croniter and the IANA
        # database (a 422 naming the fix): no JSON Schema says which strings those are
        "operations": [
            {
                "include-path": "/api/v1/periodic",
                "include-method": "POST",
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "400", "401", "403", "404", "409", "413", "422"]
                    }
                },
            }
        ],
    }
)

#: Examples per operation and mode: 25 in the default run (42 operations x 2 modes, about 20 s on
#: two shared cores: any operation that answers 5xx or off-schema for a common input is caught);
#: DELAYQ_SCHEMATHESIS_EXAMPLES=50 (or more) searches deeper, about 40 s.
EXAMPLES = int(os.environ.get("DELAYQ_SCHEMATHESIS_EXAMPLES", "25"))


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_no_server_errors_and_responses_match_the_schema(app: FastAPI, mode: schemathesis.GenerationMode) -> None:
    # schemathesis' pytest loader (from_fixture) does not work with this pytest, so each operation
    # gets its own hypothesis run here
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app, config=CONFIG)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 42
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: Any) -> None:
            case.call_and_validate(headers=AUTH)

        run()
