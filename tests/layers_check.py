#!/usr/bin/env python3
"""The aggregator core's layers hold (issue 35: no include circle, the HTTP layer calls the round engine and the
state, the state never calls up).

usage: layers_check.py BUILD_DIR [SOURCE_DIR] [--nm NM]

1. Calls. Every object of the library dprec_agg_core (BUILD_DIR/aggregator/CMakeFiles/dprec_agg_core.dir/<folder>/
   *.o, the list the library is archived from) is read with nm: each symbol it defines belongs to its folder, and each
   symbol it leaves undefined that another object defines is a call (or a use of data) from its folder into that one.
   A call into a folder above the caller's in LAYERS fails, naming the caller, the callee and the symbol. Calls
   through function pointers (a protocol's table, the store's open callback) are not seen: they are the sanctioned
   way up.
2. Includes (when SOURCE_DIR is given). A source of the library and a header of a layer folder may include headers of
   its own folder and of the folders below it, never one above, nor one of another folder of aggregator/ that is not a
   layer of the core. (The commands beside the core, such as train/train_cmd.c of dprec-aggregator, are not checked.)
Exits non-zero listing every violation."""
import argparse
import os
import re
import subprocess
import sys

# The documented order, top to bottom (docs/architecture.md, "The aggregator core's layers"; the head of
# aggregator/base/agg_base.h says the same). A folder may call its own folder and the folders after it in this list.
LAYERS = ["core", "rounds", "protocols", "train", "state", "base"]
RANK = {name: i for i, name in enumerate(LAYERS)}

ap = argparse.ArgumentParser()
ap.add_argument("build_dir")
ap.add_argument("source_dir", nargs="?")
ap.add_argument("--nm", default="nm")
args = ap.parse_args()

problems = []
objdir = os.path.join(args.build_dir, "aggregator", "CMakeFiles", "dprec_agg_core.dir")
if not os.path.isdir(objdir):
    sys.exit(f"layers_check: {objdir} does not exist (is the aggregator core built?)")

# The objects the library is made of: the archive command of link.txt (Makefile generators), else every object under
# the folder (a stale object of a deleted source would then count too).
objects = []
link = os.path.join(objdir, "link.txt")
if os.path.exists(link):
    with open(link, encoding="utf-8") as f:
        for word in f.read().split():
            if word.endswith(".o") and "dprec_agg_core.dir/" in word:
                objects.append(os.path.join(objdir, word.split("dprec_agg_core.dir/", 1)[1]))
else:
    for base, _, names in os.walk(objdir):
        objects += [os.path.join(base, n) for n in names if n.endswith(".o")]
if not objects:
    sys.exit(f"layers_check: no objects of dprec_agg_core under {objdir}")


def folder_of(obj):
    rel = os.path.relpath(obj, objdir)
    return rel.split(os.sep)[0] if os.sep in rel else ""


def source_of(obj):
    rel = os.path.relpath(obj, objdir)
    return rel[:-2] if rel.endswith(".o") else rel


defined = {}     # symbol -> object
undefined = {}   # object -> set of symbols
for obj in sorted(objects):
    folder = folder_of(obj)
    if folder not in RANK:
        problems.append(f"{source_of(obj)} is in aggregator/{folder or '.'}, which is not a layer of LAYERS")
        continue
    out = subprocess.run([args.nm, "-P", obj], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"layers_check: {args.nm} -P {obj} failed: {out.stderr.strip()}")
    undefined[obj] = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined[obj].add(name)
        elif kind.isupper() and kind not in "UW":  # global text, data, bss, read-only data, common
            defined[name] = obj

calls = 0
for obj, names in sorted(undefined.items()):
    for name in sorted(names):
        callee = defined.get(name)
        if callee is None or callee == obj:
            continue
        src, dst = folder_of(obj), folder_of(callee)
        if src == dst:
            continue
        calls += 1
        if RANK[dst] < RANK[src]:
            problems.append(f"{source_of(obj)} ({src}/) calls {name} of {source_of(callee)} ({dst}/), a layer above "
                            f"it")

includes = 0
if args.source_dir:
    agg = os.path.join(args.source_dir, "aggregator")
    folders = {d for d in os.listdir(agg) if os.path.isdir(os.path.join(agg, d))}
    inc = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/[^"]+"', re.M)
    library = {os.path.normpath(os.path.join(agg, source_of(obj))) for obj in objects}
    for layer in LAYERS:
        for base, _, names in os.walk(os.path.join(agg, layer)):
            for n in sorted(names):
                path = os.path.normpath(os.path.join(base, n))
                if not (n.endswith(".h") or (n.endswith(".c") and path in library)):
                    continue
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for target in inc.findall(text):
                    if target not in folders:
                        continue  # not a folder of aggregator/ (a header of common/ or include/)
                    includes += 1
                    rel = os.path.relpath(path, args.source_dir)
                    if target not in RANK:
                        problems.append(f"{rel} includes a header of aggregator/{target}/, which is not a layer of the "
                                        f"core")
                    elif RANK[target] < RANK[layer]:
                        problems.append(f"{rel} ({layer}/) includes a header of {target}/, a layer above it")

for p in problems:
    print("layers_check:", p)
if problems:
    print("layers_check: the order, top to bottom:", " > ".join(LAYERS), "(docs/architecture.md)")
    sys.exit(1)
print(f"layers_check: ok ({len(undefined)} objects, {calls} calls across folders, {includes} includes across folders; "
      f"order {' > '.join(LAYERS)})")
