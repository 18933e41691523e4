"""Float64 references for the TLOB encoder (kernels/tlob.py, agent/tlob.py): attention, residual layer norm, the
per-sample transpose, and the whole encoder's forward and backward, written from the module headers in plain numpy
(whole-array algebra, not the kernels' loops). Shared by tests/kernels/test_tlob_kernels.py and
tests/agent/test_tlob.py, so tests/reference.py stays as it is.
"""

from __future__ import annotations

import numpy as np

LN_EPS = 1e-5


def split_heads(qkv: np.ndarray, seq: int, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v [N, H, S, E] of the fused projection qkv [N*S, 3W]."""
    rows, w3 = qkv.shape
    w = w3 // 3
    parts = np.asarray(qkv, np.float64).reshape(rows // seq, seq, 3, heads, w // heads)
    return tuple(parts[:, :, m].transpose(0, 2, 1, 3) for m in range(3))


def merge_heads(t: np.ndarray) -> np.ndarray:
    """[N, H, S, E] -> [N*S, H*E]."""
    n, h, s, e = t.shape
    return t.transpose(0, 2, 1, 3).reshape(n * s, h * e)


def probabilities(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Softmax rows P [N, H, S, S] of q k^T / sqrt(E) and their log-sum-exps [N, H, S]."""
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    top = s.max(axis=-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(s - top).sum(axis=-1))
    return np.exp(s - lse[..., None]), lse


def attention64(qkv: np.ndarray, seq: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """out [N*S, W] and lse [N*S, H] of scaled dot-product attention per sequence and head."""
    q, k, v = split_heads(qkv, seq, heads)
    p, lse = probabilities(q, k)
    return merge_heads(p @ v), lse.transpose(0, 2, 1).reshape(-1, heads)


def attention_bwd64(qkv: np.ndarray, dout: np.ndarray, seq: int, heads: int) -> np.ndarray:
    """dqkv [N*S, 3W] from dout [N*S, W]: the softmax Jacobian written with P (not through lse or dO . O)."""
    q, k, v = split_heads(qkv, seq, heads)
    p, _ = probabilities(q, k)
    n, h, s, e = q.shape
    do = np.asarray(dout, np.float64).reshape(n, s, h, e).transpose(0, 2, 1, 3)
    dv = p.transpose(0, 1, 3, 2) @ do
    dp = do @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(e)
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    return np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=1)


def add_layer_norm64(x: np.ndarray, a: np.ndarray, gamma: np.ndarray, beta: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """y = LN(x + a) gamma + beta over the last axis and stats [R, 2] = (mean, 1 / sqrt(var + eps))."""
    z = np.asarray(x, np.float64) + a
    mu = z.mean(axis=1)
    rstd = 1.0 / np.sqrt(((z - mu[:, None]) ** 2).mean(axis=1) + LN_EPS)
    return (z - mu[:, None]) * rstd[:, None] * gamma + beta, np.stack([mu, rstd], axis=1)


def add_layer_norm_bwd64(dy: np.ndarray, x: np.ndarray, a: np.ndarray, gamma: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dz = dL/d(x + a), dgamma, dbeta from dy, by the chain rule through mean and variance term by term."""
    z = np.asarray(x, np.float64) + a
    w = z.shape[1]
    mu = z.mean(axis=1, keepdims=True)
    var = ((z - mu) ** 2).mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xh = (z - mu) * rstd
    g = dy * gamma
    dvar = (g * (z - mu)).sum(axis=1, keepdims=True) * -0.5 * rstd**3
    dmu = -(g * rstd).sum(axis=1, keepdims=True) - 2.0 * dvar * (z - mu).mean(axis=1, keepdims=True)
    dz = g * rstd + dvar * 2.0 * (z - mu) / w + dmu / w
    return dz, (dy * xh).sum(axis=0), dy.sum(axis=0)


def batch_transpose64(x: np.ndarray, rows: int) -> np.ndarray:
    """[B*R, C] -> [B*C, R], each sample's R x C block transposed."""
    n, c = x.shape
    return x.reshape(n // rows, rows, c).transpose(0, 2, 1).reshape(n // rows * c, rows)


def sublayer_names(block: int, view: str) -> dict[str, str]:
    """The parameter names of one attention sublayer (agent/tlob.py's layout)."""
    pre = f"tlob.block{block}.{view}."
    return {k: pre + k for k in ("qkv.weight", "qkv.bias", "out.weight", "out.bias", "norm.gamma", "norm.beta")}


def encoder64(p: dict[str, np.ndarray], x: np.ndarray, seq: int, width: int, n_blocks: int, heads_time: int,
              heads_feature: int) -> tuple[np.ndarray, list]:
    """out [B, n_out] of the encoder on x [B, T*F] (agent/tlob.py's header) and the cache its backward reads."""
    batch = x.shape[0]
    h = np.asarray(x, np.float64).reshape(batch * seq, -1) @ p["tlob.embed.weight"] + p["tlob.embed.bias"]
    cache: list = []
    for block in range(n_blocks):
        if block:
            h = batch_transpose64(h, width)  # feature view [B*D, T] -> time view [B*T, D]
        for view, s, heads in (("time", seq, heads_time), ("feature", width, heads_feature)):
            if view == "feature":
                h = batch_transpose64(h, seq)
            n = sublayer_names(block, view)
            qkv = h @ p[n["qkv.weight"]] + p[n["qkv.bias"]]
            att, _ = attention64(qkv, s, heads)
            a = att @ p[n["out.weight"]] + p[n["out.bias"]]
            y, _ = add_layer_norm64(h, a, p[n["norm.gamma"]], p[n["norm.beta"]])
            cache.append((block, view, s, heads, h, qkv, att, a, y))
            h = y
    return h.reshape(batch, width * seq) @ p["tlob.head.weight"] + p["tlob.head.bias"], cache


def encoder_bwd64(p: dict[str, np.ndarray], x: np.ndarray, cache: list, dout: np.ndarray, seq: int, width: int
                  ) -> dict[str, np.ndarray]:
    """dL/dp for every parameter from dout = dL/dout, by hand through encoder64's steps in reverse."""
    batch = x.shape[0]
    g: dict[str, np.ndarray] = {}
    g["tlob.head.weight"] = cache[-1][-1].reshape(batch, -1).T @ dout
    g["tlob.head.bias"] = dout.sum(axis=0)
    dh = (dout @ p["tlob.head.weight"].T).reshape(batch * width, seq)
    for block, view, s, heads, h, qkv, att, a, _ in reversed(cache):
        n = sublayer_names(block, view)
        dz, g[n["norm.gamma"]], g[n["norm.beta"]] = add_layer_norm_bwd64(dh, h, a, p[n["norm.gamma"]])
        g[n["out.weight"]], g[n["out.bias"]] = att.T @ dz, dz.sum(axis=0)
        dqkv = attention_bwd64(qkv, dz @ p[n["out.weight"]].T, s, heads)
        g[n["qkv.weight"]], g[n["qkv.bias"]] = h.T @ dqkv, dqkv.sum(axis=0)
        dh = dz + dqkv @ p[n["qkv.weight"]].T
        if view == "feature":
            dh = batch_transpose64(dh, width)  # back to the time view
        elif block:
            dh = batch_transpose64(dh, seq)  # back to the previous block's feature view
    xr = np.asarray(x, np.float64).reshape(batch * seq, -1)
    g["tlob.embed.weight"], g["tlob.embed.bias"] = xr.T @ dh, dh.sum(axis=0)
    return g
