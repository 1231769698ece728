#!/usr/bin/env python3
"""The portable code stays portable: sdk/ (the device) and common/ (what the device shares with the servers) call no
C allocator outside the allocator seam (sdk/alloc.c), no stdio, no non-cryptographic randomness, and include only
freestanding C headers, <math.h>, <string.h>, mbedTLS, and the compiler's own x86 intrinsic headers (<immintrin.h>,
<cpuid.h>: instructions, no OS or libc; common/sha256.c, under its architecture test) (../shared/STYLE.md,
"Anti-patterns"; BRIEF.md, "Memory").

usage: portable_check.py REPO_ROOT
Exits non-zero listing every violation."""
import os
import re
import sys

root = sys.argv[1]
allowed_system = re.compile(r"^(stddef|stdint|stdbool|float|limits|stdarg|math|string|immintrin|cpuid)\.h$|"
                            r"^mbedtls/[a-z0-9_]+\.h$")
banned_call = re.compile(r"\b(malloc|calloc|realloc|free|printf|fprintf|sprintf|puts|fopen|rand|srand|random|drand48|"
                         r"rand_r|getenv|exit|abort)\s*\(")
comment_line = re.compile(r"^\s*(\*|/\*|//)")
problems = []
for top in ("sdk", "common"):
    for base, _, names in os.walk(os.path.join(root, top)):
        for n in sorted(names):
            if not n.endswith((".c", ".h")):
                continue
            rel = os.path.relpath(os.path.join(base, n), root)
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                lines = f.read().split("\n")
            for i, line in enumerate(lines, 1):
                m = re.match(r"\s*#\s*include\s*<([^>]+)>", line)
                if m and not allowed_system.match(m.group(1)):
                    problems.append(f"{rel}:{i} includes <{m.group(1)}> (portable code: no OS or libc I/O headers)")
                if n.startswith("alloc") or comment_line.match(line):
                    continue
                code = re.sub(r'"(\\.|[^"\\])*"', '""', line.split("//")[0])
                m = banned_call.search(code)
                if m:
                    problems.append(f"{rel}:{i} calls {m.group(1)}() (portable code: the allocator seam, the port and "
                                    f"the CSPRNG only)")
for p in problems:
    print("portable_check:", p)
if problems:
    sys.exit(1)
print("portable_check: ok")
