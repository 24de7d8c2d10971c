"""The line of every key in a TOML document: the one thing tomllib does not report.

tomllib parses; this index only remembers where things are, for errors such as
``recipe.toml:12: [bench] batch must be ...``. The text is taken one statement at a
time: a ``[table]`` or ``[[array]]`` header is one line, and a ``key = value``
statement runs from its line to the first line at which it parses alone (tomllib
decides, so a bracket, ``=`` or ``#`` inside a string is never taken for structure,
and a multi-line array or string is one statement). Every key inside a statement's
value is at the statement's line, but for the elements of a multi-line array: each is
at the line where it ends (the first line after which the array so far, closed there,
holds it). Keys are paths as tomllib's result is indexed: ``("variants", 1, "steps", 0, "pass")``.
"""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

KeyPath = tuple  # of str (keys) and int (array indices)


def key_lines(text: str) -> dict[KeyPath, int]:
    """The line (1-based) where each key, table and array element of a valid TOML document is."""
    lines = text.split("\n")  # TOML's newlines; str.splitlines would also split at \x0c or \u2028 in strings
    found: dict[KeyPath, int] = {}
    arrays: dict[KeyPath, int] = {}  # an array of tables -> the index of its latest [[element]]
    table: KeyPath = ()
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        if stripped.startswith("["):
            keys, is_array = _header(lines[i])
            if is_array:
                base = _resolve(keys[:-1], arrays) + (keys[-1],)
                arrays[base] = arrays.get(base, -1) + 1
                found.setdefault(base, i + 1)
                table = base + (arrays[base],)
            else:
                table = _resolve(keys, arrays)
            found.setdefault(table, i + 1)
            i += 1
            continue
        end, value = _statement(lines, i)
        _record(found, table, value, i + 1)
        if end > i:
            _record_elements(found, table, value, lines, i, end)
        i = end + 1
    return found


def _parse(lines: list[str]) -> dict | None:
    try:
        return tomllib.loads("\n".join(lines) + "\n")
    except tomllib.TOMLDecodeError:
        return None


def _header(line: str) -> tuple[list[str], bool]:
    """The keys of a ``[a.b]`` / ``[[a.b]]`` line, and whether it opens an array element."""
    node = _parse([line]) or {}
    keys = []
    while isinstance(node, dict) and len(node) == 1:
        key, node = next(iter(node.items()))
        keys.append(key)
    return keys, isinstance(node, list)


def _resolve(keys: list[str], arrays: dict[KeyPath, int]) -> KeyPath:
    """A header's keys as a path: a key naming an array of tables means its latest element."""
    path: KeyPath = ()
    for key in keys:
        path += (key,)
        if path in arrays:
            path += (arrays[path],)
    return path


def _statement(lines: list[str], start: int) -> tuple[int, dict]:
    """The last line of the statement at ``start``, and what it parses to alone."""
    for end in range(start, len(lines)):
        value = _parse(lines[start : end + 1])
        if value is not None:
            return end, value
    return start, {}  # not valid TOML: the caller's parse says where


def _record(found: dict, prefix: KeyPath, value, line: int, *, replace: bool = False) -> None:
    """``line`` for every key and array element inside ``value``, under ``prefix``."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        path = prefix + (key,)
        if replace:
            found[path] = line
        else:
            found.setdefault(path, line)
        _record(found, path, inner, line, replace=replace)


def _record_elements(found: dict, table: KeyPath, value: dict, lines: list[str], start: int, end: int) -> None:
    """The elements of a multi-line array (``steps = [`` ... ``]``), each at the line where it ends."""
    keys: KeyPath = ()
    while isinstance(value, dict) and len(value) == 1:  # a dotted key: a.b = [ ...
        key, value = next(iter(value.items()))
        keys += (key,)
    if not isinstance(value, list):
        return  # a multi-line string
    seen = 0
    for line in range(start, end):
        closed = _parse([*lines[start : line + 1], "]"])
        if closed is None:
            continue
        for key in keys:
            closed = closed[key]
        for index in range(seen, len(closed)):
            found[table + keys + (index,)] = line + 1
            _record(found, table + keys + (index,), value[index], line + 1, replace=True)
        seen = max(seen, len(closed))
    for index in range(seen, len(value)):  # the last ones, on the line that closes the array
        found[table + keys + (index,)] = end + 1
        _record(found, table + keys + (index,), value[index], end + 1, replace=True)
