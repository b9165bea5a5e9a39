"""Records the programs the suite lowers, and compares two recordings: the check that a
refactoring leaves every program printing, serializing, drawing and counting as before.

    # before the change, and again after it (same selection of tests):
    HOSTIR_RECORD_PROGRAMS=/tmp/before python3 -m pytest -q -p no:cacheprovider
    HOSTIR_RECORD_PROGRAMS=/tmp/after python3 -m pytest -q -p no:cacheprovider
    python3 scripts/record_programs.py compare /tmp/before /tmp/after
    python3 scripts/record_programs.py summary /tmp/before

The recorder itself is tests/program_recorder.py (a pytest plugin of the suite): one
folder per distinct program (keyed by a hash of its text) with its text, JSON, DOT
source and static traffic, and a manifest entry per lowering naming the test, the
process (``pytest``, or ``python`` for any other), the rank and the ordinal of the
lowering within the test.

``compare`` matches programs two ways: by the hash of their text (a program in one
recording and not the other), and by the lowering that produced them (test, process,
rank, ordinal), so that a program whose text changed is paired with its old self. For
each pair it says which of text / JSON / DOT / traffic differ and shows unified diffs
of the first few (``--diffs N``). For programs with the same text it compares the
other three. ``--subset``: AFTER recorded only some tests; compare BEFORE's lowerings
in those tests only. Exit code 0 when nothing differs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests.program_recorder import (  # noqa: E402  (after the path insertion)
    ARTIFACTS,
    program_hashes,
    read_manifest,
    read_program,
)

NAMES = {"program.hir": "text", "program.json": "JSON", "program.dot": "DOT"}
NAMES["traffic.txt"] = "traffic"
DIFF_LINES = 60
"""The most lines of one unified diff that are shown."""


class Recording:
    """One recording folder: its lowerings (key -> hash) and programs (read lazily)."""

    def __init__(self, folder: str, tests: set[str] | None = None) -> None:
        self.folder = pathlib.Path(folder)
        if not (self.folder / "manifest").is_dir():
            raise SystemExit(f"{folder}: not a recording (no manifest/ folder)")
        lowerings = read_manifest(self.folder)
        if tests is not None:
            lowerings = {k: h for k, h in lowerings.items() if k[0] in tests}
        self.lowerings = lowerings
        self.hashes = set(lowerings.values())
        missing = self.hashes - program_hashes(self.folder)
        if missing:
            raise SystemExit(f"{folder}: the manifest names programs not recorded: {missing}")
        self._programs: dict[str, dict[str, str]] = {}

    @property
    def tests(self) -> set[str]:
        return {key[0] for key in self.lowerings}

    def program(self, digest: str) -> dict[str, str]:
        if digest not in self._programs:
            self._programs[digest] = read_program(self.folder, digest)
        return self._programs[digest]

    def describe(self) -> str:
        return (
            f"{self.folder}: {len(self.hashes)} programs, {len(self.lowerings)} lowerings"
            f" in {len(self.tests)} tests"
        )

    def first_lowering(self, digest: str) -> str:
        test, process, rank, ordinal = min(k for k, h in self.lowerings.items() if h == digest)
        return _key_text((test, process, rank, ordinal))


def _key_text(key: tuple) -> str:
    test, process, rank, ordinal = key
    return f"{test} ({process}, rank {rank}, lowering {ordinal})"


def differing(before: dict[str, str], after: dict[str, str]) -> tuple[str, ...]:
    """The artifacts (file names) whose content differs."""
    return tuple(name for name in ARTIFACTS if before[name] != after[name])


def unified(before: str, after: str, name: str, where: str) -> str:
    lines = list(
        difflib.unified_diff(
            before.splitlines(),
            after.splitlines(),
            f"before/{name}",
            f"after/{name}",
            lineterm="",
        )
    )
    cut = f"\n... ({len(lines) - DIFF_LINES} more lines)" if len(lines) > DIFF_LINES else ""
    return f"--- {where}: {NAMES[name]}\n" + "\n".join(lines[:DIFF_LINES]) + cut


def compare(before: Recording, after: Recording, diffs: int) -> int:
    """Prints the comparison; returns the number of differences found."""
    print("before:", before.describe())
    print("after: ", after.describe())
    pairs: list[tuple[str, dict[str, str], dict[str, str]]] = []  # (where, before, after)
    total = _by_text(before, after, diffs)
    total += _same_text(before, after, pairs)
    total += _by_lowering(before, after, diffs, pairs)
    _show_diffs(pairs, diffs)
    print("no differences" if total == 0 else f"{total} differences")
    return total


def _by_text(before: Recording, after: Recording, diffs: int) -> int:
    """Programs (by the hash of their text) in one recording and not the other."""
    only_before = sorted(before.hashes - after.hashes)
    only_after = sorted(after.hashes - before.hashes)
    both = before.hashes & after.hashes
    print(
        f"programs by text: {len(both)} in both, {len(only_before)} only before,"
        f" {len(only_after)} only after"
    )
    for label, hashes, rec in (("before", only_before, before), ("after", only_after, after)):
        for digest in hashes[:diffs]:
            print(f"  only {label}: {digest}, first lowered by {rec.first_lowering(digest)}")
        if len(hashes) > diffs:
            print(f"  ... and {len(hashes) - diffs} more only {label}")
    return len(only_before) + len(only_after)


def _same_text(before: Recording, after: Recording, pairs: list) -> int:
    """Programs with the same text in both whose JSON, DOT or traffic differ."""
    by_change = collections.defaultdict(list)
    for digest in sorted(before.hashes & after.hashes):
        old, new = before.program(digest), after.program(digest)
        changed = differing(old, new)
        if changed:
            by_change[changed].append(digest)
            pairs.append((f"program {digest}", old, new))
    count = sum(len(v) for v in by_change.values())
    print(f"programs with the same text whose JSON, DOT or traffic differ: {count}")
    for changed, digests in sorted(by_change.items()):
        print(f"  {', '.join(NAMES[n] for n in changed)}: {len(digests)}")
    return count


def _by_lowering(before: Recording, after: Recording, diffs: int, pairs: list) -> int:
    """Lowerings (test, process, rank, ordinal) in one recording only, or with another
    program in each."""
    keys_before, keys_after = set(before.lowerings), set(after.lowerings)
    paired = sorted(keys_before & keys_after)
    moved = [k for k in paired if before.lowerings[k] != after.lowerings[k]]
    missing, added = sorted(keys_before - keys_after), sorted(keys_after - keys_before)
    print(
        f"lowerings by (test, process, rank, ordinal): {len(paired)} in both"
        f" ({len(moved)} with another program), {len(missing)} only before,"
        f" {len(added)} only after"
    )
    for label, keys in (("before", missing), ("after", added)):
        for key in keys[:diffs]:
            print(f"  only {label}: {_key_text(key)}")
        if len(keys) > diffs:
            print(f"  ... and {len(keys) - diffs} more only {label}")
    by_change = collections.defaultdict(list)
    for key in moved:
        old, new = before.program(before.lowerings[key]), after.program(after.lowerings[key])
        by_change[differing(old, new)].append(key)
        pairs.append((_key_text(key), old, new))
    for changed, keys in sorted(by_change.items()):
        distinct = {(before.lowerings[k], after.lowerings[k]) for k in keys}
        names = ", ".join(NAMES[n] for n in changed)
        print(f"  {names} differ: {len(keys)} lowerings ({len(distinct)} distinct pairs)")
    return len(missing) + len(added) + len(moved)


def _show_diffs(pairs: list, diffs: int) -> None:
    """Unified diffs of the first ``diffs`` distinct pairs of programs."""
    shown = set()
    for where, old, new in pairs:
        if len(shown) >= diffs:
            break
        signature = tuple(old[n] for n in ARTIFACTS), tuple(new[n] for n in ARTIFACTS)
        if signature in shown:
            continue
        shown.add(signature)
        for name in differing(old, new):
            print(unified(old[name], new[name], name, where))


def summary(recording: Recording, top: int) -> None:
    """Prints the recording's size and the tests that lowered the most programs."""
    print(recording.describe())
    per_test = collections.Counter(key[0] for key in recording.lowerings)
    per_process = collections.Counter(key[1] for key in recording.lowerings)
    print("lowerings per process kind:", dict(sorted(per_process.items())))
    errors = collections.Counter()
    for digest in recording.hashes:
        traffic = recording.program(digest)["traffic.txt"]
        if traffic.startswith("error: "):
            errors[traffic.split(":", 2)[1].strip()] += 1
    print("programs whose traffic is an error:", dict(errors) or "none")
    print(f"tests with the most lowerings (of {len(per_test)}):")
    for test, count in per_test.most_common(top):
        print(f"  {count:6d}  {test}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    comparing = commands.add_parser("compare", help="compare two recordings")
    comparing.add_argument("before")
    comparing.add_argument("after")
    comparing.add_argument("--diffs", type=int, default=3, help="how many diffs to show")
    comparing.add_argument(
        "--subset", action="store_true", help="compare only the tests AFTER recorded"
    )
    summing = commands.add_parser("summary", help="the size of a recording")
    summing.add_argument("folder")
    summing.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    if args.command == "summary":
        summary(Recording(args.folder), args.top)
        return 0
    after = Recording(args.after)
    before = Recording(args.before, after.tests if args.subset else None)
    return 1 if compare(before, after, args.diffs) else 0


if __name__ == "__main__":
    sys.exit(main())
