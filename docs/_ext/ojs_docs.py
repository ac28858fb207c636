"""Sphinx directives that write reference tables from the code they describe.

* ``.. ojs-settings::``: every ``ojs_*`` setting, its default and its meaning, from
  :class:`ojs_kombu.spec.settings.OJSSettings` (the fields and their ``#:`` comments);
* ``.. ojs-commands::``: every ``ojs-kombu`` command with its usage line and the first
  line of its help, from the click group;
* ``.. ojs-exit-codes::``: the CLI's exit codes, from ``EXIT_CODES``;
* ``.. ojs-modules:: PACKAGE``: an ``automodule`` for every module of PACKAGE;
* ``.. ojs-differences:: KIND``: the differences from Celery (``refused`` or
  ``different``), from :data:`ojs_kombu.cli.differences.DIFFERENCES`.

The tables are built from the code at build time, so a page cannot drift from it.
:func:`command_rows` and :func:`setting_rows` are plain functions the test suite uses.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from typing import Any

import click
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.nodes import nested_parse_with_titles

SETTINGS_MODULE = "ojs_kombu.spec.settings"


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if hasattr(value, "model_dump"):
        return "see below" if value.model_dump(exclude_defaults=True) else "``{}``"
    return f"``{value!r}``"


def setting_rows() -> list[tuple[str, str, str]]:
    """``(setting, default, meaning)`` for every field of ``OJSSettings``, in order."""
    from ojs_kombu.spec.settings import OPTION_PREFIX, OJSSettings

    docs = ModuleAnalyzer.for_module(SETTINGS_MODULE).find_attr_docs()
    rows = []
    for name, field in OJSSettings.model_fields.items():
        meaning = " ".join(line.strip() for line in docs.get(("OJSSettings", name), []))
        rows.append((f"{OPTION_PREFIX}{name}", _default(field), meaning.strip()))
    return rows


def _walk(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    found = []
    context = click.Context(group, info_name=prefix)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        path = f"{prefix} {name}"
        if isinstance(command, click.Group):
            found += _walk(command, path)
        else:
            found.append((path, command))
    return found


#: Options every broker command takes (named once, above the table), left out of its row.
COMMON_OPTIONS = ("help", "json", "broker", "prefix", "connect_timeout")


def command_rows() -> list[tuple[str, str, str]]:
    """``(command, usage, summary)`` for every ``ojs-kombu`` command, as its ``--help``
    says."""
    from ojs_kombu.cli.main import cli

    rows = []
    for path, command in _walk(cli, "ojs-kombu"):
        context = click.Context(command, info_name=path)
        pieces = command.collect_usage_pieces(context)
        flags = []
        for param in command.get_params(context):
            if isinstance(param, click.Option) and not param.hidden \
                    and param.name not in COMMON_OPTIONS \
                    and "--app" not in param.opts and "--help" not in param.opts:
                flags.append(max(param.opts, key=len))
        usage = " ".join([path, *pieces[1:]]) if pieces else path
        usage = f"{usage}  ({', '.join(flags)})" if flags else usage
        rows.append((path, usage, command.get_short_help_str(limit=300)))
    return rows


def _table(title: str, header: list[str], rows: list[tuple[str, ...]],
           widths: str) -> list[str]:
    lines = [f".. list-table:: {title}", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [tuple(header), *rows]:
        for index, cell in enumerate(row):
            lines.append(("   * - " if index == 0 else "     - ") + (cell or "-"))
    return lines


class _Generated(Directive):
    has_content = False
    optional_arguments = 1

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[Any]:
        container = StringList(self.lines(), source=f"<{self.name}>")
        from docutils import nodes

        node = nodes.section() if self.name == "ojs-modules" else nodes.container()
        nested_parse_with_titles(self.state, container, node)
        return list(node.children)


class SettingsTable(_Generated):
    def lines(self) -> list[str]:
        return _table("", ["setting", "default", "meaning"], setting_rows(), "25 15 60")


class CommandsTable(_Generated):
    def lines(self) -> list[str]:
        rows = [(f"``{usage}``", summary) for _, usage, summary in command_rows()]
        return _table("", ["command", "does"], rows, "45 55")


class ExitCodesTable(_Generated):
    def lines(self) -> list[str]:
        from ojs_kombu.cli.exits import EXIT_CODES

        rows = [(str(code), meaning) for code, meaning in EXIT_CODES.items()]
        return _table("", ["code", "meaning"], rows, "8 92")


class DifferencesTable(_Generated):
    """``.. ojs-differences:: refused|different``: the rows of
    :data:`ojs_kombu.cli.differences.DIFFERENCES` of that kind, each with its anchor
    (what ``migrate check`` links to)."""

    required_arguments = 1
    optional_arguments = 0

    def lines(self) -> list[str]:
        from ojs_kombu.cli.differences import DIFFERENCES

        kind = self.arguments[0]
        lines = [f".. list-table:: {kind.capitalize()}", "   :header-rows: 1",
                 "   :widths: 55 45", "", "   * - ojs_kombu", "     - why"]
        for difference in DIFFERENCES:
            if difference.kind == kind:
                lines += [f"   * - .. _{difference.anchor}:", "", f"       {difference.what}",
                          "", f"       *migrate check reports it for:* {difference.met_by}",
                          f"     - {difference.why}"]
        return lines


class ModulesReference(_Generated):
    required_arguments = 1
    optional_arguments = 0

    def lines(self) -> list[str]:
        package = import_module(self.arguments[0])
        names = sorted(m.name for m in pkgutil.iter_modules(package.__path__,
                                                            package.__name__ + "."))
        lines: list[str] = []
        for name in names:
            lines += [f".. automodule:: {name}", "   :members:", ""]
        return lines


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("ojs-settings", SettingsTable)
    app.add_directive("ojs-commands", CommandsTable)
    app.add_directive("ojs-exit-codes", ExitCodesTable)
    app.add_directive("ojs-modules", ModulesReference)
    app.add_directive("ojs-differences", DifferencesTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
