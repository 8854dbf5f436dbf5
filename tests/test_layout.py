#!/usr/bin/python3
"""The shape of the installed headers holds what docs/design.md promises.

    /usr/bin/python3 tests/test_layout.py <source dir>

Checked, over include/elastic (the installed API) and examples/:
- no header is longer than 450 lines, unless it is listed below as one concept, with why;
- layers: config/error/events/internal <- timer <- checkpoint <- rendezvous <- comm <- torch. A header
  includes no header of a layer above its own, and no `detail/` header of another layer
  above it; nothing in include/ includes tools/;
- the examples include only public headers (no `detail/`, no `internal/`);
- internals have names that never shadow each other: the library-wide ones are
  `elastic::internal` (include/elastic/internal/), a layer's own are `elastic::LAYER::detail`
  (include/elastic/LAYER/detail/); no `elastic::LAYER::internal` and no root `elastic::internal`;
- every namespace of the library is opened inside the ABI namespace `elastic::inline v1`, and
  config.hpp names the same version.
Exits 0 when everything holds, 1 with one line per failed check.
"""

import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
INC = os.path.join(ROOT, "include", "elastic")
MAX_LINES = 450
# Headers allowed past MAX_LINES because they hold one concept that does not split well.
ONE_CONCEPT = {
    "internal/json.hpp": "one JSON value type: reader, writer and accessors of the same variant",
    "rendezvous/rendezvous.hpp": "the round state machine (join, close, watch, leave) and its key schema; "
                                 "records, ids, options and the lease keeper are in rendezvous/detail/",
    "comm/nccl.hpp": "the NCCL communicator: init, collectives, abort, revoke, shrink, grow; runtime probing "
                     "and version gates are comm/detail/nccl_runtime.hpp, handle creation "
                     "comm/detail/nccl_handle.hpp, the CUDA RAII internal/cuda.hpp",
    "comm/elastic_group.hpp": "the group's round lifecycle: a failure or a change, the rebuild, the resync; "
                              "admission, state resync, shard moves and peer replicas are in comm/detail/",
}
LAYERS = {"": 0, "internal": 0, "timer": 1, "checkpoint": 2, "rendezvous": 3, "comm": 4, "torch": 5, "*": 6}
ABI = "v1"

failures = []


def fail(msg):
    failures.append(msg)


def headers():
    for base, _, files in os.walk(INC):
        for f in sorted(files):
            if f.endswith(".hpp"):
                path = os.path.join(base, f)
                yield os.path.relpath(path, INC), path


def layer_of(rel):
    """The layer of a header path relative to include/elastic ("timer/client.hpp" -> timer). An
    umbrella header belongs to the layer it gathers (timer.hpp -> timer; elastic.hpp -> all)."""
    if "/" not in rel:
        stem = rel[: -len(".hpp")] if rel.endswith(".hpp") else rel
        if stem == "elastic":
            return "*"
        return stem if stem in LAYERS else ""
    first = rel.split("/")[0]
    return first if first in LAYERS else None


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


include_re = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
ns_re = re.compile(r"\bnamespace\s+([A-Za-z_][\w:]*(?:\s*::\s*inline\s+\w+[\w:]*)?|inline\s+\w+)\s*\{")

for rel, path in headers():
    text = open(path, encoding="utf-8").read()
    lines = text.count("\n")
    if lines > MAX_LINES and rel not in ONE_CONCEPT:
        fail(f"{rel}: {lines} lines, over {MAX_LINES}: split it at its seams, or list it in ONE_CONCEPT with why")
    mine = layer_of(rel)
    if mine is None:
        fail(f"{rel}: in a directory that is not a layer of docs/design.md ({', '.join(k for k in LAYERS if k)})")
        continue
    for inc in include_re.findall(text):
        if inc.startswith("tools/") or "/tools/" in inc:
            fail(f"{rel}: includes {inc}: nothing in include/ uses tools/")
        if not inc.startswith("elastic/"):
            continue
        target = inc[len("elastic/"):]
        theirs = layer_of(target)
        if theirs is None or theirs == "*":
            continue
        if LAYERS[theirs] > LAYERS[mine]:
            fail(f"{rel}: includes {inc}, of a layer above its own ({theirs} over {mine or 'the root'})")
    code = strip_comments(text)
    for m in re.finditer(r"\bnamespace\s+([\w:\s]+?)\s*\{", code):
        name = re.sub(r"\s+", " ", m.group(1)).strip()
        if name.startswith("elastic"):
            if not name.startswith(f"elastic::inline {ABI}"):
                fail(f"{rel}: opens `namespace {name}` outside the ABI namespace elastic::inline {ABI}")
            parts = name.replace(f"inline {ABI}", "").replace("::::", "::").split("::")
            parts = [p for p in parts if p]
            if parts[:2] == ["elastic", "detail"]:
                fail(f"{rel}: `namespace {name}`: the library-wide internals are elastic::internal")
            if len(parts) >= 3 and parts[2] == "internal":
                fail(f"{rel}: `namespace {name}` shadows elastic::internal: a layer's internals are LAYER::detail")
        elif name == "internal" and mine not in ("", "internal"):
            fail(f"{rel}: a nested `namespace internal` shadows elastic::internal")
        elif name == "detail" and mine in ("", "internal"):
            fail(f"{rel}: a root header opens a nested `namespace detail`: use elastic::internal")

config = open(os.path.join(INC, "config.hpp"), encoding="utf-8").read()
if not re.search(rf"#\s*define\s+ELASTIC_ABI_VERSION\s+{ABI}\b", config):
    fail(f"config.hpp does not define ELASTIC_ABI_VERSION {ABI}, the inline namespace the headers open")

for base, _, files in os.walk(os.path.join(ROOT, "examples")):
    for f in files:
        if not f.endswith((".cpp", ".hpp", ".cu")):
            continue
        path = os.path.join(base, f)
        for inc in include_re.findall(open(path, encoding="utf-8").read()):
            if inc.startswith("elastic/") and ("/detail/" in inc or "/internal/" in inc):
                fail(f"examples/{os.path.relpath(path, os.path.join(ROOT, 'examples'))}: includes {inc}, "
                     "which is not API")

for f in failures:
    print("FAIL", f)
print(f"{len(failures)} failure(s)" if failures else "layout: every check holds")
sys.exit(1 if failures else 0)
