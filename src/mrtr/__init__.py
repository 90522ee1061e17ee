"""mrtr: await-style multi round-trip flows for MCP servers that run on a stateless fleet.

Read top-down: `flows` (registration) -> `engine` (one request) -> `replay` (one run
against the journal) -> `journal` (what is remembered) ; `context` is what a flow awaits,
`asks` how questions look on the wire, `errors` what can go wrong.
"""

from mrtr.asks import Capability
from mrtr.context import FlowContext, StepInfo, current_step
from mrtr.errors import (
    Cancelled,
    Declined,
    FlowDefinitionError,
    FlowError,
    FlowExpired,
    InputRefused,
    NondeterminismError,
    StateTooLarge,
    TooManyRounds,
)
from mrtr.flows import Flows

__all__ = [
    "Cancelled",
    "Capability",
    "Declined",
    "FlowContext",
    "FlowDefinitionError",
    "FlowError",
    "FlowExpired",
    "Flows",
    "InputRefused",
    "NondeterminismError",
    "StateTooLarge",
    "StepInfo",
    "TooManyRounds",
    "current_step",
]

__version__ = "0.1.0"
