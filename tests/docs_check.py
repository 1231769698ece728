#!/usr/bin/env python3
"""The docs and comments say things the code can check (issue 19, point 8: a header cited a file that did not
exist, the documented allocator block count was 7 where the code takes 10, the stack requirement was not stated).

usage: docs_check.py REPO_ROOT

1. Every repository path cited in the sources, headers, tests, scripts and docs (sdk/..., common/..., include/...,
   aggregator/..., relay/..., bindings/..., tests/..., docs/..., platform/..., bench/..., scripts/..., examples/...)
   names a file that exists.
2. Every test function a doc cites (`test_...`) exists in tests/.
3. docs/sdk.md's count of allocator blocks is the number of blocks sdk/client.c takes (its BLK_ enum).
4. docs/sdk.md's stack requirement is the one tests/test_stack.c holds the SDK to.
5. docs/architecture.md, the map of the tree: every folder its table names exists, every file a row names (`x.c`)
   exists in that row's folder, every top-level folder of the product is in the table, and README.md links the page
   on its first screen (its first 25 lines).
6. Every Prometheus series the servers export (a `# TYPE dprec_...` in aggregator/ or relay/) is named in
   docs/operations.md.
Exits non-zero listing every mismatch."""
import os
import re
import sys

root = sys.argv[1]
problems = []


def read(rel):
    try:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        problems.append(f"{rel} is missing")
        return ""


def files_under(*dirs, exts=(".c", ".h", ".md", ".sh", ".py", ".cmake", ".txt", ".java", ".in")):
    for d in dirs:
        for base, _, names in os.walk(os.path.join(root, d)):
            for n in names:
                if n.endswith(exts):
                    yield os.path.relpath(os.path.join(base, n), root)


# 1. cited paths exist
scanned = list(files_under("sdk", "common", "include", "aggregator", "relay", "bindings", "tests", "docs", "platform",
                           "bench", "scripts", "examples", "cmake"))
scanned += ["README.md", "CMakeLists.txt"]
cite = re.compile(r"(?<![\w./-])((?:sdk|common|include/dprec|aggregator|relay|bindings|tests|docs|platform|bench|scripts|"
                  r"examples|toolchains|cmake)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(?:c|h|md|sh|py|cmake|java|in))\b")
for rel in scanned:
    for path in set(cite.findall(read(rel))):
        if "*" in path or "<" in path:
            continue
        if not os.path.exists(os.path.join(root, path)):
            problems.append(f"{rel} cites {path}, which does not exist")

# 2. cited tests exist
test_sources = "".join(read(t) for t in files_under("tests", exts=(".c", ".py", ".cmake")))
for doc in ["docs/sdk.md", "docs/release-format.md", "docs/privacy.md", "README.md"]:
    for name in set(re.findall(r"`(test_[a-z0-9_]+)`", read(doc))):
        if not re.search(r"\b" + name + r"\b", test_sources):
            problems.append(f"{doc} cites {name}, which no test defines")

# 3. allocator blocks
enum = re.search(r"enum \{ (BLK_[A-Z_, ]+) \};", read("sdk/client.c"))
blocks = [b.strip() for b in enum.group(1).split(",") if b.strip() and b.strip() != "BLK_COUNT"] if enum else []
words = {"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
said = re.search(r"allocator hooks with a hard cap\*\* \(`dprec_client_init_with_allocator`\): (\w+) blocks",
                 read("docs/sdk.md"))
if not said or words.get(said.group(1), -1) != len(blocks):
    problems.append(f"docs/sdk.md gives {said.group(1) if said else 'no'} allocator blocks; sdk/client.c takes "
                    f"{len(blocks)}")

# 4. stack requirement
held = re.search(r"#define DOC_STACK_BYTES (\d+)u", read("tests/test_stack.c"))
stated = re.search(r"needs (\d+) KiB of stack", read("docs/sdk.md"))
if not held or not stated or int(stated.group(1)) * 1024 != int(held.group(1)):
    problems.append(f"docs/sdk.md's stack requirement ({stated.group(1) + ' KiB' if stated else 'none stated'}) is not "
                    f"the {held.group(1) if held else '?'} bytes tests/test_stack.c holds")

# 5. the architecture page is a true map
arch = read("docs/architecture.md")
mapped = set()
for line in arch.split("\n"):
    m = re.match(r"^\| ((?:`[a-z0-9_/.]+/`(?:, )?)+) \|(.*)$", line)
    if not m:
        continue
    folders = re.findall(r"`([a-z0-9_/.]+/)`", m.group(1))
    for folder in folders:
        mapped.add(folder.split("/")[0])
        if not os.path.isdir(os.path.join(root, folder)):
            problems.append(f"docs/architecture.md maps {folder}, which does not exist")
    if len(folders) == 1:
        for name in re.findall(r"`([A-Za-z0-9_]+\.(?:c|h|py))`", m.group(2)):
            if not os.path.exists(os.path.join(root, folders[0], name)):
                problems.append(f"docs/architecture.md names {name} in {folders[0]}, which does not exist there")
product_dirs = {"include", "sdk", "common", "platform", "bindings", "aggregator", "relay", "examples", "bench",
                "scripts", "tests"}
for d in sorted(product_dirs - mapped):
    if os.path.isdir(os.path.join(root, d)):
        problems.append(f"docs/architecture.md's folder table does not map {d}/")
if "docs/architecture.md" not in "\n".join(read("README.md").split("\n")[:25]):
    problems.append("README.md does not link docs/architecture.md on its first screen (its first 25 lines)")

# 6. every exported series is documented
ops = read("docs/operations.md")
for rel in sorted(files_under("aggregator", "relay", exts=(".c",))):
    for name in sorted(set(re.findall(r"# TYPE (dprec_[a-z0-9_]+) ", read(rel)))):
        if not re.search(r"`%s(?![a-z0-9_])" % name, ops):  # `name`, `name{label}`: not a longer name
            problems.append(f"{rel} exports {name}, which docs/operations.md does not name")

for p in problems:
    print("docs_check:", p)
if problems:
    sys.exit(1)
print(f"docs_check: ok ({len(scanned)} files scanned)")
