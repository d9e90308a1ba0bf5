"""Fit the coefficients of the fp32 erfc in tf_autofuse/cc/cpu/packet_math.h (ErfcPacket).

    python scripts/fit_erfc.py        # needs numpy and scipy; prints the float32 coefficients

Three relative-minimax fits (Lawson-weighted least squares on Chebyshev points), each coefficient
rounded to float32 in turn (lowest degree first) and the remaining ones refitted, so the rounded
set is what is fitted:
  E: erf(a) ~ a E(a^2), deg E = 4, on [0, 0.5], the error weighted by erfc(a) (what 1 - a E
     loses is measured at the result);
  C: exp(r) ~ 1 + r + r^2 C(r), deg C = 4, on |r| <= 0.3467 (ln2/2 and the lo part of a^2);
  P/Q: erfcx(a) = erfc(a) exp(a^2) ~ P(a)/Q(a), deg 4/5, P(0) = Q(0) = 1, on [0.5, 10.1]
     (linearised: P - f Q divided by f times the previous Q).
Printed errors are relative, in units of 2^-24. Integrating the kernel's error over all float32 is
a separate check (see the commit that introduced this script).
"""

import numpy as np
from scipy.special import erf, erfc, erfcx


def f32(v):
    return float(np.float32(v))


def cheb(lo, hi, n):
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)[::-1]
    return lo + (hi - lo) * (t + 1) / 2


def lawson(a, b, scale, fixed, iters=60):
    """min over c of max |(a c - b) / scale|, c[j] = fixed[j] where given."""
    n = a.shape[1]
    free = [j for j in range(n) if j not in fixed]
    c = np.zeros(n)
    for j, v in fixed.items():
        c[j] = v
    rest = b - a @ c
    w = np.ones(len(b))
    err = (a @ c - b) / scale
    for _ in range(iters if free else 0):
        s = np.sqrt(w) / scale
        c[free] = np.linalg.lstsq(a[:, free] * s[:, None], rest * s, rcond=None)[0]
        err = (a @ c - b) / scale
        w = w * np.abs(err)
        w /= w.sum()
    return c, np.abs(err).max()


def fit_rounded(solve, n):
    fixed = {}
    for j in range(n):
        fixed[j] = f32(solve(fixed)[0][j])
    return solve(fixed)


def fit_poly(a, b, scale):
    return fit_rounded(lambda fixed: lawson(a, b, scale, fixed), a.shape[1])


def fit_rational(m, n, lo, hi, points=6000):
    x = cheb(lo, hi, points)
    f = erfcx(x)
    xp = x[:, None] ** np.arange(1, m + 1)
    xq = x[:, None] ** np.arange(1, n + 1)
    a = np.hstack([xp, -f[:, None] * xq])

    def solve(fixed):
        q_prev = np.ones(points)
        for _ in range(30):
            c, _ = lawson(a, f - 1.0, f * q_prev, fixed, iters=20)
            q_prev = 1 + xq @ c[m:]
        return c, np.abs((1 + xp @ c[:m]) / q_prev / f - 1).max()

    c, err = fit_rounded(solve, m + n)
    return [1.0] + list(c[:m]), [1.0] + list(c[m:]), err


def hexf(v):
    mantissa, exponent = f32(v).hex().split("p")
    return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}f"


def show(name, coefs, err, note=""):
    print(f"{name} (lowest degree first): " + ", ".join(hexf(v) for v in coefs))
    print(f"   max error {err / 2**-24:.3f} x 2^-24{note}")


def main():
    a = cheb(0.0, 0.5, 4000)
    e, err = fit_poly(a[:, None] * (a * a)[:, None] ** np.arange(5), erf(a), erfc(a))
    show("E", e, err, " of erfc(a)")
    r = cheb(-0.3467, 0.3467, 4000)
    c, err = fit_poly(r[:, None] ** np.arange(2, 7), np.exp(r) - 1 - r, np.exp(r))
    show("C", c, err)
    p, q, err = fit_rational(4, 5, 0.5, 10.1)
    show("P", p, err)
    show("Q", q, err)


if __name__ == "__main__":
    main()
