"""How far a replayed gradient is from the FP32 reference, per layer: the measures shadow steps record.

Per layer (the gradients of the parameters it holds, flat): the relative error
||g - g32|| / ||g32||, the cosine of g to g32, the share of ||g32|| lost where
g is zero and g32 is not, and the share of non-finite values of g. `Reference`
holds the reference once per shadow step and compares each replay with it.
"""

from __future__ import annotations

import math

from .readable import real_parts


def flat(grads: dict, names: list):
    """One flat float32 tensor of the named gradients (None when none of them has one); a sparse gradient
    (Embedding(sparse=True)) as its dense values, a complex one as its real and imaginary parts (the norm and
    the products are those of the complex vector)."""
    import torch

    parts = [real_parts(g.to_dense() if g.is_sparse else g).reshape(-1) for g in (grads.get(n) for n in names)
             if g is not None]
    return torch.cat(parts) if parts else None


COMPARE_CHUNK = 1 << 22
"""Reference gradient values joined into one float64 vector (bounds the comparison's temporaries)."""
_NO_GRADIENT = {"rel_error": 1.0, "cosine": 0.0, "zeroed_share": 1.0, "nonfinite_share": 0.0}


class Reference:
    """The FP32 reference gradient g32 of every layer that has one (norm > 0), flat and joined in float64
    (chunks of up to COMPARE_CHUNK values), to compare the replays of a shadow step against.

    A shadow step compares every layer at every scale it replays: joined, that is a few whole-vector ops
    and one dot product per layer and measure, rather than a dozen ops and temporaries per layer.
    """

    def __init__(self, grads: dict, groups: list):
        import torch

        self.groups = groups
        self.chunks: list = []            # [([layer names], [lengths], joined float64 g32, [||g32||^2])]
        pending, size = [], 0
        for i, (name, names) in enumerate(groups):
            g = flat(grads, names)
            if g is not None:
                pending.append((name, g))
                size += g.numel()
            if pending and (size >= COMPARE_CHUNK or i == len(groups) - 1):
                lengths = [g.numel() for _, g in pending]
                joined = torch.cat([g for _, g in pending]).double()
                squares = [float(torch.dot(part, part)) for part in joined.split(lengths)]
                kept = [i for i, r2 in enumerate(squares) if r2 > 0]
                if len(kept) < len(pending):
                    pending, lengths, squares = ([x[i] for i in kept] for x in (pending, lengths, squares))
                    joined = torch.cat([g for _, g in pending]).double() if pending else None
                if pending:
                    self.chunks.append(([n for n, _ in pending], lengths, joined, squares))
                pending, size = [], 0
        self.layers = {n for names, *_ in self.chunks for n in names}

    def __contains__(self, layer: str) -> bool:
        return layer in self.layers

    def compare(self, grads: dict) -> dict:
        """{layer: measurements} of the gradients in `grads` (parameter name -> tensor or None) for every
        layer here: the relative error ||g - g32|| / ||g32||, the cosine of g to g32, the share of ||g32||
        lost where g is zero and g32 is not, and the share of non-finite values of g (when there are any,
        the error is inf and the others None). In float64."""
        import torch

        flats = {name: flat(grads, names) for name, names in self.groups if name in self.layers}
        out = {}
        for names, lengths, g32, squares in self.chunks:
            present = [flats[n] is not None for n in names]
            for name, n, here in zip(names, lengths, present):
                if not here:
                    out[name] = dict(_NO_GRADIENT)
                elif flats[name].numel() != n:
                    raise ValueError(f"the replayed gradient of {name} has {flats[name].numel()} values, its "
                                     f"reference {n}")
            if not any(present):
                continue
            g = torch.cat([flats[n] if here else torch.zeros(k, device=g32.device)
                           for n, k, here in zip(names, lengths, present)]).double()
            lo, hi = torch.aminmax(g)
            nonfinite = [0.0] * len(names)
            if not (math.isfinite(lo.item()) and math.isfinite(hi.item())):
                nonfinite = [float((~torch.isfinite(part)).sum()) for part in g.split(lengths)]
            diff, zeroed = g - g32, torch.where(g == 0, g32, 0.0)
            parts = zip(g.split(lengths), g32.split(lengths), diff.split(lengths), zeroed.split(lengths))
            for name, n, here, bad, r2, (gi, ri, di, zi) in zip(names, lengths, present, nonfinite, squares, parts):
                if not here:
                    continue
                if bad:
                    out[name] = {"rel_error": math.inf, "cosine": None, "zeroed_share": None,
                                 "nonfinite_share": bad / n}
                    continue
                norm32, norm = math.sqrt(r2), math.sqrt(float(torch.dot(gi, gi)))
                out[name] = {"rel_error": math.sqrt(float(torch.dot(di, di))) / norm32,
                             "cosine": float(torch.dot(gi, ri)) / (norm * norm32) if norm else 0.0,
                             "zeroed_share": math.sqrt(float(torch.dot(zi, zi))) / norm32, "nonfinite_share": 0.0}
        return out
