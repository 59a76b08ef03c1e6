#!/usr/bin/env python3
"""Checks the direction of the dependencies between roll's modules.

Usage: check_layering.py REPO_ROOT

A module is a folder under src/ (everything below it, subfolders included)
together with its public headers under include/roll/<module>/. Each module
has a level (LEVELS below); a module may depend only on modules of a
strictly lower level. A dependency between two modules of the same level is
an error unless it is listed in SAME_LEVEL_EXCEPTIONS.

Two kinds of dependency are checked:

  * includes: every `#include "..."` in the .h/.hpp/.cc/.cpp files under
    src/<module>/ and include/roll/<module>/. "roll/<m>/..." is module m
    (public header), "<m>/..." with <m> a folder of src/ is module m (private
    header), any "*.pb.h" is rpc (generated from src/rpc/*.proto); every
    other include is external and ignored.
  * private folders: an include of a PRIVATE_FOLDERS path from outside its
    module is an error whatever the levels.
  * link dependencies: the roll::<x> and roll_<x> targets named in the DEPS
    and PRIVATE_DEPS of roll_library() and in target_link_libraries() in the
    CMakeLists.txt files under src/<module>/. ${var} is resolved from set()
    and list(APPEND) in the same file.

A folder under src/ or include/roll/ that is not in the table is an error:
a new module has to be given its level here.

Prints one line per offence and exits 1; prints a one-line summary and
exits 0 when there is none; exits 2 on a usage error. Python 3.8+, stdlib
only.
"""

import os
import re
import sys

# Lowest level first. A module may depend only on modules of a lower level.
LEVELS = {
    "common": 0,
    "rpc": 1,
    "models": 2,
    "algorithms": 2,
    "data": 2,
    "rewards": 2,
    "envs": 2,
    "tracking": 2,
    "scheduler": 3,
    "strategies": 3,
    "workers": 4,
    "controller": 5,
    "pipeline": 6,
    "cli": 7,
}

# Allowed dependencies between two modules of the same level, each with the
# reason it is allowed.
SAME_LEVEL_EXCEPTIONS = {
    # The reward functions read the answer format of the generated tasks.
    ("rewards", "data"): "reward functions read the generated task's answer format",
}

# Downward dependencies that are still not allowed: the runtime drives
# worker processes and knows what they are called, not what they compute.
FORBIDDEN = {
    # The runtime loads no model (workers do; pipelines prepare prompts).
    ("controller", "models"): "the runtime loads no model",
    ("controller", "strategies"): "the runtime runs no training or generation",
    ("controller", "algorithms"): "the runtime knows no RL algorithm",
    ("controller", "data"): "data sets are the pipelines' to read",
    ("controller", "tracking"): "metrics are the pipelines' to write",
    ("controller", "rewards"): "rewards are computed by reward workers",
}

# Private folders that no other module may include, even one above their
# module: what a module keeps to itself. The RL workers' set-up and
# internals are theirs; what others need of them is public (weight sync in
# roll/strategies/weight_sync.h, the batch keys in roll/worker/batch_keys.h).
PRIVATE_FOLDERS = {
    "workers/rl/": ("workers", "the RL workers' internals (use roll/strategies/weight_sync.h, "
                    "roll/worker/batch_keys.h)"),
}

# Public header folders (include/roll/<folder>/) whose name is not the
# module's name.
HEADER_DIR_ALIASES = {
    "worker": "workers",
}

# roll targets whose name is not roll::<module> / roll_<module>. Targets
# defined in a src/<module>/CMakeLists.txt are also found by reading it.
TARGET_ALIASES = {
    "rl_workers": "workers",
    "sft": "pipeline",
    "rpc_proto": "rpc",
    "env_proto": "rpc",
}

# roll_* / roll::* targets that are not a module (third-party wrappers).
EXTERNAL_TARGETS = {
    "roll_torch",
    "roll::torch",
}

SOURCE_EXTENSIONS = (".h", ".hpp", ".cc", ".cpp", ".cxx")

TARGET_RE = re.compile(r"roll(?:::|_)([A-Za-z0-9_]+)")
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"')


def describe(module):
    return "%s (level %d)" % (module, LEVELS[module])


def dependency_error(src_module, dst_module):
    """Why src_module may not depend on dst_module, or None if it may."""
    if src_module == dst_module:
        return None
    src_level, dst_level = LEVELS[src_module], LEVELS[dst_module]
    if (src_module, dst_module) in FORBIDDEN:
        return "%s may not depend on %s (%s)" % (
            describe(src_module), describe(dst_module), FORBIDDEN[(src_module, dst_module)])
    if dst_level < src_level:
        return None
    if dst_level == src_level:
        if (src_module, dst_module) in SAME_LEVEL_EXCEPTIONS:
            return None
        return "%s may not depend on %s (same level; not in the exception list)" % (
            describe(src_module), describe(dst_module))
    return "%s may not depend on %s" % (describe(src_module), describe(dst_module))


# --------------------------------------------------------------------------
# C++ sources


def strip_cpp_comments(text):
    """Returns text with comments and raw-string bodies blanked out.

    Newlines are kept, so line numbers stay. Ordinary string literals are
    kept (an include's path is one).
    """
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            # Line comment, continued by a trailing backslash.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
        elif c == "/" and nxt == "*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "R" and nxt == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
                                         or text[i - 1] in "uUL8"):
            m = re.match(r'R"([^()\\ \t\n]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            end = text.find(close, i + m.end())
            end = n if end < 0 else end + len(close)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            # String or character literal (a ' after a digit or letter is a
            # digit separator or part of a prefix-less name, not a literal).
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n) if j < n and text[j] == c else j
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def include_module(path, src_modules):
    """The module an include path names, None if external, or a problem."""
    parts = path.split("/")
    if parts[0] == "roll" and len(parts) >= 2:
        if len(parts) == 2:
            return ("unknown", "roll/ has no headers outside a module folder")
        name = HEADER_DIR_ALIASES.get(parts[1], parts[1])
        if name in LEVELS:
            return ("module", name)
        return ("unknown", "include/roll/%s/ is not a module" % parts[1])
    if len(parts) >= 2 and parts[0] in src_modules:
        name = parts[0]
        if name in LEVELS:
            return ("module", name)
        return None  # Its folder is reported as unknown already.
    if parts[-1].endswith(".pb.h"):
        return ("module", "rpc")
    return None


def source_files(folder):
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXTENSIONS):
                yield os.path.join(dirpath, name)


# --------------------------------------------------------------------------
# CMake


def cmake_commands(text):
    """Yields (name, line, args) for each command; args are (kind, text, line)
    with kind one of "unquoted", "quoted", "bracket"."""
    i, n, line = 0, len(text), 1

    def skip_bracket(start):
        # text[start] == "["; returns (content, end) or None.
        m = re.match(r"\[(=*)\[", text[start:])
        if not m:
            return None
        close = "]" + m.group(1) + "]"
        end = text.find(close, start + m.end())
        if end < 0:
            return text[start + m.end():], n
        return text[start + m.end():end], end + len(close)

    def skip_comment(start):
        # text[start] == "#"; returns the index after the comment.
        if start + 1 < n and text[start + 1] == "[":
            b = skip_bracket(start + 1)
            if b:
                return b[1]
        end = text.find("\n", start)
        return n if end < 0 else end

    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif c == "#":
            j = skip_comment(i)
            line += text.count("\n", i, j)
            i = j
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i:])
            name, name_line = m.group(0), line
            i += m.end()
            while i < n and text[i] in " \t":
                i += 1
            if i >= n or text[i] != "(":
                continue
            i += 1
            depth, args = 1, []
            while i < n and depth > 0:
                c = text[i]
                if c == "\n":
                    line += 1
                    i += 1
                elif c in " \t\r":
                    i += 1
                elif c == "#":
                    j = skip_comment(i)
                    line += text.count("\n", i, j)
                    i = j
                elif c == "(":
                    depth += 1
                    i += 1
                elif c == ")":
                    depth -= 1
                    i += 1
                elif c == '"':
                    j, start_line = i + 1, line
                    while j < n and text[j] != '"':
                        j += 2 if text[j] == "\\" else 1
                    value = text[i + 1:j]
                    line += value.count("\n")
                    args.append(("quoted", value, start_line))
                    i = j + 1
                elif c == "[" and skip_bracket(i):
                    value, j = skip_bracket(i)
                    args.append(("bracket", value, line))
                    line += text.count("\n", i, j)
                    i = j
                else:
                    j = i
                    while j < n and text[j] not in ' \t\r\n()#"':
                        if text[j] == "\\":
                            j += 1
                        j += 1
                    args.append(("unquoted", text[i:j], line))
                    i = j
            yield name, name_line, args
        else:
            i += 1


VAR_RE = re.compile(r"\$\{([^${}]*)\}")


def expand(args, variables):
    """Expands ${var}; returns a list of (value, line). A value that comes
    from a variable keeps the line where the variable was set."""
    values = []
    for kind, raw, line in args:
        if kind == "bracket":
            values.append((raw, line))
            continue
        whole = VAR_RE.fullmatch(raw)
        if kind == "unquoted" and whole:
            values.extend(variables.get(whole.group(1), []))
            continue
        text = raw
        for _ in range(10):
            new = VAR_RE.sub(lambda m: ";".join(v for v, _ in variables.get(m.group(1), [])), text)
            if new == text:
                break
            text = new
        if kind == "quoted":
            values.append((text, line))
        else:
            values.extend((v, line) for v in text.split(";") if v)
    return values


def link_token_target(token):
    """The target a link item names, without a generator expression around it."""
    m = re.fullmatch(r"\$<(?:[A-Z_]+):(.*)>", token)
    return m.group(1) if m else token


def parse_cmake(path):
    """Returns (defined, links): defined is the list of target names the
    file creates; links is a list of (owner, linked, line)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    variables, defined, links = {}, [], []
    for name, line, args in cmake_commands(text):
        lname = name.lower()
        if lname in ("set", "list", "unset", "roll_library", "roll_proto_library",
                     "add_library", "add_executable", "target_link_libraries"):
            values = expand(args, variables)
        else:
            continue
        if lname == "set" and values:
            var, rest = values[0][0], values[1:]
            for k, (v, _) in enumerate(rest):
                if v in ("CACHE", "PARENT_SCOPE"):
                    rest = rest[:k]
                    break
            variables[var] = rest
        elif lname == "unset" and values:
            variables.pop(values[0][0], None)
        elif lname == "list" and len(values) >= 2 and values[0][0] in ("APPEND", "PREPEND"):
            var = values[1][0]
            old = variables.get(var, [])
            variables[var] = old + values[2:] if values[0][0] == "APPEND" else values[2:] + old
        elif lname in ("roll_library", "roll_proto_library"):
            section, owner, deps = None, None, []
            for v, vline in values:
                if v in ("NAME", "SOURCES", "DEPS", "PRIVATE_DEPS", "PROTOS"):
                    section = v
                elif v == "TORCH":
                    continue
                elif section == "NAME" and owner is None:
                    owner = v
                elif section in ("DEPS", "PRIVATE_DEPS"):
                    deps.append((v, vline))
            if owner:
                if lname == "roll_library":
                    defined += ["roll_" + owner, "roll::" + owner]
                    owner = "roll_" + owner
                else:
                    defined.append(owner)
            links += [(owner or name, v, vline) for v, vline in deps]
        elif lname in ("add_library", "add_executable") and values:
            defined.append(values[0][0])
        elif lname == "target_link_libraries" and values:
            owner = values[0][0]
            for v, vline in values[1:]:
                if v in ("PUBLIC", "PRIVATE", "INTERFACE", "LINK_PUBLIC", "LINK_PRIVATE",
                         "LINK_INTERFACE_LIBRARIES", "debug", "optimized", "general"):
                    continue
                links.append((owner, v, vline))
    return defined, links


# --------------------------------------------------------------------------


def check(root):
    src_dir = os.path.join(root, "src")
    inc_dir = os.path.join(root, "include", "roll")
    if not os.path.isdir(src_dir):
        print("check_layering: no src/ folder under %s" % root, file=sys.stderr)
        return 2

    def rel(path):
        return os.path.relpath(path, root).replace(os.sep, "/")

    offences = []  # (file, line, message)
    src_modules = sorted(d for d in os.listdir(src_dir) if os.path.isdir(os.path.join(src_dir, d)))
    for d in src_modules:
        if d not in LEVELS:
            offences.append(("src/%s" % d, 0, "src/%s/ is not a known module: give it a level in "
                             "tests/check_layering.py" % d))

    # Folders to scan: (folder, module or None when unknown).
    folders = [(os.path.join(src_dir, d), d if d in LEVELS else None) for d in src_modules]
    if os.path.isdir(inc_dir):
        for d in sorted(os.listdir(inc_dir)):
            full = os.path.join(inc_dir, d)
            if not os.path.isdir(full):
                if d.endswith(SOURCE_EXTENSIONS):
                    offences.append((rel(full), 0, "header outside any module folder"))
                continue
            module = HEADER_DIR_ALIASES.get(d, d)
            if module not in LEVELS:
                offences.append((rel(full), 0, "include/roll/%s/ is not a known module: give it a "
                                 "level in tests/check_layering.py" % d))
                module = None
            folders.append((full, module))
    for name in sorted(os.listdir(src_dir)):
        if name.endswith(SOURCE_EXTENSIONS) and os.path.isfile(os.path.join(src_dir, name)):
            offences.append(("src/" + name, 0, "source file outside any module folder"))

    n_files = n_includes = 0
    for folder, module in folders:
        if module is None:
            continue
        for path in source_files(folder):
            n_files += 1
            with open(path, encoding="utf-8", errors="replace") as f:
                text = strip_cpp_comments(f.read())
            for lineno, line in enumerate(text.split("\n"), 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                n_includes += 1
                target = include_module(m.group(1), src_modules)
                if target is None:
                    continue
                kind, what = target
                if kind == "unknown":
                    offences.append((rel(path), lineno, 'includes "%s": %s' % (m.group(1), what)))
                    continue
                why = dependency_error(module, what)
                if why:
                    offences.append((rel(path), lineno, 'includes "%s": %s' % (m.group(1), why)))
                for prefix, (owner, reason) in PRIVATE_FOLDERS.items():
                    if m.group(1).startswith(prefix) and module != owner:
                        offences.append((rel(path), lineno, 'includes "%s": private to %s (%s)' % (
                            m.group(1), owner, reason)))

    # Link dependencies.
    target_module = {}
    link_records = []  # (file, module, owner, linked, line)
    n_cmake = 0
    for d in src_modules:
        for dirpath, dirnames, filenames in os.walk(os.path.join(src_dir, d)):
            dirnames.sort()
            if "CMakeLists.txt" not in filenames:
                continue
            path = os.path.join(dirpath, "CMakeLists.txt")
            n_cmake += 1
            defined, links = parse_cmake(path)
            module = d if d in LEVELS else None
            for t in defined:
                target_module[t] = module
            link_records += [(rel(path), module, owner, linked, line) for owner, linked, line in links]

    n_links = 0
    seen = set()
    for path, module, owner, linked, line in link_records:
        token = link_token_target(linked)
        if module is None or token in EXTERNAL_TARGETS:
            continue
        if token in target_module:
            dst = target_module[token]
        else:
            m = TARGET_RE.fullmatch(token)
            if not m:
                continue  # Not a roll target: third-party, or a variable's value.
            name = TARGET_ALIASES.get(m.group(1), m.group(1))
            if name not in LEVELS:
                offences.append((path, line, "links %s (target %s): not a known roll target; map it "
                                 "to its module in tests/check_layering.py" % (token, owner)))
                continue
            dst = name
        if dst is None:
            continue  # Defined in an unknown folder, which is reported already.
        key = (path, line, owner, token)
        if key in seen:
            continue
        seen.add(key)
        n_links += 1
        why = dependency_error(module, dst)
        if why:
            offences.append((path, line, "links %s (target %s): %s" % (token, owner, why)))

    if offences:
        for path, line, message in sorted(offences):
            print("%s:%d: %s" % (path, line, message) if line else "%s: %s" % (path, message))
        print("check_layering: %d layering violation(s)" % len(offences), file=sys.stderr)
        return 1
    n_modules = len({m for _, m in folders if m})
    print("check_layering: OK: %d modules, %d files, %d includes, %d CMakeLists.txt, %d roll link "
          "dependencies checked" % (n_modules, n_files, n_includes, n_cmake, n_links))
    return 0


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return check(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
