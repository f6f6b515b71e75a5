"""Test support for graphexec backends: the contract suites and their helpers.

Every checkpoint backend's test module subclasses :class:`CheckpointerContract` and overrides
its ``checkpointer`` fixture; see :mod:`graphexec.testing.contracts`. Memory backends subclass
the suites in :mod:`graphexec.testing.memory_contracts` and
:mod:`graphexec.testing.archival_contract` (imported on demand: they need the ``memory`` package).
"""

from __future__ import annotations

import pytest

# Plain ``assert``s in the suites should report values the way assertions in test files do.
pytest.register_assert_rewrite(
    "graphexec.testing._contract_helpers",
    "graphexec.testing._lease_contract",
    "graphexec.testing._retention_contract",
    "graphexec.testing.contracts",
    "graphexec.testing.memory_contracts",
    "graphexec.testing.archival_contract",
)

from graphexec.testing.contracts import (  # noqa: E402 - must follow register_assert_rewrite
    CheckpointerContract,
    assert_eventually,
    make_checkpoint,
    put_chain,
)

__all__ = [
    # contract suites
    "CheckpointerContract",
    # helpers
    "assert_eventually",
    "make_checkpoint",
    "put_chain",
]
