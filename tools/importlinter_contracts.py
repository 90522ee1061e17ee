"""An import-linter contract for one fence of mrtr's: the SDK's private modules only in `mrtr._sdk`.

import-linter sees external packages only as their root (`mcp`), so its built-in
contracts cannot tell `mcp.server.mcpserver` (public) from `mcp.shared._httpx_utils`
(private). This contract reads the import statements themselves: any module of `packages`
whose import of an external root names a private submodule or name (a component starting
with `_`, in the module path or among the names on the import's first line) breaks it,
unless it is one of the `allowed` modules.
"""

from __future__ import annotations

import re

from importlinter import Contract, ContractCheck, fields, output

_IMPORTED = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+\(?([\w\s,]*)|import\s+([\w.]+))")


class ExternalPrivateImportsContract(Contract):
    type_name = "external_private_imports"

    source = fields.StringField()
    """The package whose modules are checked (its descendants too)."""
    external = fields.ListField(subfield=fields.StringField())
    """The external root packages whose private submodules are fenced."""
    allowed = fields.ListField(subfield=fields.StringField(), required=False)
    """The modules that may import them (the adapter)."""

    def check(self, graph, verbose: bool) -> ContractCheck:  # type: ignore[no-untyped-def]
        allowed = set(self.allowed or [])
        offenders: list[dict[str, object]] = []
        modules = {m for m in graph.modules if m == self.source or m.startswith(f"{self.source}.")}
        for importer in sorted(modules - allowed):
            for root in self.external:
                if root not in graph.modules:
                    continue
                for detail in graph.get_import_details(importer=importer, imported=root):
                    match = _IMPORTED.match(detail["line_contents"])
                    if match is None:
                        continue
                    path = match.group(1) or match.group(3)
                    names = [n.split()[0] for n in (match.group(2) or "").split(",") if n.strip()]
                    if any(part.startswith("_") for part in [*path.split(".")[1:], *names]):
                        offenders.append(
                            {"importer": importer, "line": detail["line_number"], "text": detail["line_contents"]}
                        )
        return ContractCheck(kept=not offenders, metadata={"offenders": offenders})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for offender in check.metadata["offenders"]:
            output.print_error(f"{offender['importer']}:{offender['line']}: {offender['text']}", bold=False)
        output.new_line()
        output.print(f"Move these imports into {', '.join(self.allowed or [])}, the one adapter of SDK internals.")
