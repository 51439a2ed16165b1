"""``pytreestore verify`` and ``pytreestore versions``: a store checked against its commit
record, and the versions it keeps. Neither needs the store's classes."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, NoReturn

import click

import pytreestore
from pytreestore._cli.common import (
    EXIT_PROBLEMS,
    json_option,
    main,
    opened,
    print_json,
    problem_json,
    progress_option,
    show_progress,
)
from pytreestore._open.standins import open_without_classes
from pytreestore.errors import CorruptStoreError, NotAStoreError

# ---- verify -----------------------------------------------------------------------------------


@main.command()
@click.argument("path")
@progress_option
@json_option
def verify(path: str, progress: bool | None, as_json: bool) -> None:
    """Check every column of a store against its commit record.

    Prints each problem found and exits with status 1 if there is any, 0 if none.
    A store whose metadata is too damaged to open counts as one problem.
    """
    try:
        store = open_without_classes(path)
    except (CorruptStoreError, NotAStoreError) as err:
        _report_verify(path, {"records": None, "columns": None}, [str(err)], as_json)
    with store:
        facts, problems = _run_verify(store, show_progress(progress))
    _report_verify(path, facts, problems, as_json)


def _run_verify(store: pytreestore.TreeStore, progress: bool) -> tuple[dict[str, Any], list[Any]]:
    """Runs ``store.verify()``: what it checked, and the problems it found."""
    try:
        report = store.verify(progress=progress)
    except CorruptStoreError as err:
        return {"records": len(store), "columns": len(store.schema.columns)}, [str(err)]
    # any other error (storage unreachable, say: nothing can be concluded) fails the command
    facts: dict[str, Any] = {
        "records": report.records,
        "columns": report.columns,
        "chunks": report.chunks,
    }
    if report.unchecksummed:
        facts["unchecksummed"] = list(report.unchecksummed)
    return facts, list(report.problems)


def _report_verify(
    path: str, facts: dict[str, Any], problems: list[Any], as_json: bool
) -> NoReturn:
    if as_json:
        report = [problem_json(p) for p in problems]
        print_json({"path": path, **facts, "ok": not problems, "problems": report})
    elif problems:
        click.echo(f"{path}: {len(problems)} problem(s)")
        for p in problems:
            click.echo(f"  - {p}")
    else:
        checked = f", {facts['chunks']:,} chunks" if "chunks" in facts else ""
        click.echo(
            f"{path}: OK ({facts['records']:,} records, {facts['columns']} columns{checked})"
        )
    if facts.get("unchecksummed") and not as_json:
        click.echo(
            f"  (no checksums in {', '.join(facts['unchecksummed'])}: flipped bits there go unseen)"
        )
    sys.exit(EXIT_PROBLEMS if problems else 0)


@main.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
def versions(path: str, as_json: bool) -> None:
    """List the versions a store keeps: number, records, time, operation, tags."""
    with opened(path) as store:
        listed = store.versions()
    if as_json:
        print_json(
            [{**dataclasses.asdict(v), "time": v.time and v.time.isoformat()} for v in listed]
        )
        return
    for v in listed:
        when = v.time.strftime("%Y-%m-%d %H:%M:%S") if v.time else "-"
        gone = "" if v.readable else "  (gone: written over after a truncate)"
        tags = f"  [{', '.join(v.tags)}]" if v.tags else ""
        click.echo(f"{v.version:>6}  {v.records:>12,}  {when}  {v.operation or '-':<8}{tags}{gone}")
