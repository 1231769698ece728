#!/usr/bin/env python3
"""Reference values for tests/test_noise.c, from first principles with the standard library only.

  python3 tests/noise_reference.py

prints the C tables used by tests/test_noise.c:

1. dprec_phi_entry known answers (test_phi_entry_matches_the_reference_values):
entry = z / sqrt(q) with z = sqrt(-2 ln u1) cos(2 pi u2) (Box-Muller), where
h = SHA-256(seed (32 bytes) || s (u32 little-endian) || j (u32 little-endian)),
u1 = ((first LE 64-bit word of h) >> 11) + 1) / 2^53 in (0, 1], u2 = ((second LE word) >> 11) / 2^53 in [0, 1).

2. The exact integer scales of the grid mechanisms (test_grid_scales_are_the_exact_ceilings_or_just_above), with
exact rational arithmetic (fractions.Fraction holds every double exactly):
   Laplace:  g = 2^k, k = ceil(log2(fl(sens / eps))) - 40,  t = ceil((sens + g) / (eps g));
   Gaussian: g = 2^k, k = ceil(log2 sigma) - 20,            S = ceil((sigma (sens + g) / (sens g))^2).
A case the SDK must reject (t > 2^43, S > 2^53) is printed with k = 0 and value 0.
"""
from fractions import Fraction
import hashlib
import math
import struct


def phi_entry(seed: bytes, q: int, s: int, j: int) -> float:
    h = hashlib.sha256(seed + struct.pack("<II", s, j)).digest()
    w1, w2 = struct.unpack("<QQ", h[:16])
    u1 = ((w1 >> 11) + 1) / 2.0**53
    u2 = (w2 >> 11) / 2.0**53
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return z / math.sqrt(q)


SEEDS = {
    "zero": bytes(32),
    "count": bytes(range(32)),
}
CASES = [("zero", 1, 0, 0), ("zero", 16, 0, 1), ("zero", 16, 1, 0), ("count", 8, 7, 3),
         ("count", 100, 123456, 654321), ("count", 1, 0xFFFFFFFF, 0xFFFFFFFF)]


def ceil_log2(v: float) -> int:
    fr, e = math.frexp(v)
    return e - 1 if fr == 0.5 else e


def ceil_fraction(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def laplace_t(sens: float, eps: float):
    k = ceil_log2(sens / eps) - 40  # sens / eps rounded exactly as C does (IEEE double division)
    g = Fraction(2) ** k
    t = ceil_fraction((Fraction(sens) + g) / (Fraction(eps) * g))
    return (k, t) if t <= 2**43 else (0, 0)


def gaussian_s(sens: float, sigma: float):
    k = ceil_log2(sigma) - 20
    g = Fraction(2) ** k
    x = Fraction(sigma) * (Fraction(sens) + g) / (Fraction(sens) * g)
    s = ceil_fraction(x * x)
    return (k, s) if s <= 2**53 else (0, 0)


LAPLACE = [(1.0, 0.5), (1.0, 1.0), (1.0, 0.1), (3.0, 0.01), (0.001, 2.0), (2.5, 7.25), (1e6, 0.3), (1.0, 1e-12),
           (0.1, 0.1), (1.0, 3.0), (1e-300, 1e-300), (1.0, 1e-14), (123.456, 1e-9),
           # where the plain double ceiling would fall one below the exact one (found by random search):
           (1.0, 3.901874688806181), (1.0, 0.6433732540844426), (2.0, 2.8182826660552065)]
GAUSSIAN = [(1.0, 3.0), (2.0, 2000.0), (1.0, 0.75), (1.0, 1.0), (1.0, 1e7), (1e-3, 5.0), (7.0, 0.01), (1.0, 9e7),
            (1.0, 1e8), (0.1, 0.3), (3.0, 1.0 / 3.0),
            # where the plain double ceiling would fall one below the exact one (found by random search):
            (3.0, 97.32985244334016), (2.0, 74.73573574990908), (1.0, 57.27580629134853)]

if __name__ == "__main__":
    print("/* phi_entry */")
    for name, q, s, j in CASES:
        v = phi_entry(SEEDS[name], q, s, j)
        print(f"    {{SEED_{name.upper()}, {q}u, {s}u, {j}u, {v!r}}},")
    print("/* Laplace: sens, eps, k, t */")
    for sens, eps in LAPLACE:
        k, t = laplace_t(sens, eps)
        print(f"    {{{sens!r}, {eps!r}, {k}, {t}ull}},")
    print("/* Gaussian: sens, sigma, k, S */")
    for sens, sigma in GAUSSIAN:
        k, s = gaussian_s(sens, sigma)
        print(f"    {{{sens!r}, {sigma!r}, {k}, {s}ull}},")
