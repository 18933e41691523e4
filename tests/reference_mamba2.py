"""Float64 numpy references of the Mamba2 block (kernels/mamba2.py, agent/mamba2.py): the recurrence, its chunked
(SSD) form, the backward by plain backpropagation through time with every state stored, and the whole block.

Arrays are per window: x [S, T, H, P], B and C [S, T, N], dt_raw [S, T, H], heads [3, H] (a_log, D, dt_bias). The
backward here stores h_t for every bar and uses dL/d(log a_t) = <g_t, a_t h_{t-1}> directly, so it checks the
kernels' stateless form (the running R_t of kernels/mamba2.py) rather than repeating it.
"""

import numpy as np


def softplus64(v):
    return np.logaddexp(0.0, v)


def sigmoid64(v):
    return 0.5 * (1.0 + np.tanh(0.5 * v))


def split64(zxbcdt, seq_len, n_heads, head_dim, state_dim):
    """z, x [S, T, H, P], B, C [S, T, N], dt_raw [S, T, H] of an in-projection output [S T, 2HP + 2N + H]."""
    a = np.asarray(zxbcdt, np.float64).reshape(-1, seq_len, zxbcdt.shape[1])
    hp, n = n_heads * head_dim, state_dim
    z = a[..., :hp].reshape(*a.shape[:2], n_heads, head_dim)
    x = a[..., hp : 2 * hp].reshape(*a.shape[:2], n_heads, head_dim)
    return z, x, a[..., 2 * hp : 2 * hp + n], a[..., 2 * hp + n : 2 * hp + 2 * n], a[..., 2 * hp + 2 * n :]


def _discretise(dt_raw, heads):
    a_log, _, dt_bias = np.asarray(heads, np.float64)
    dt = softplus64(dt_raw + dt_bias)
    return -np.exp(a_log), dt, np.exp(dt * -np.exp(a_log))


def scan64(x, b, c, dt_raw, heads):
    """(y [S, T, H, P], states [S, T, H, P, N]) of the recurrence h_t = a_t h_{t-1} + dt_t x_t B_t^T, y = h C + D x."""
    _, dt, decay = _discretise(dt_raw, heads)
    s, t_len, n_heads, head_dim = x.shape
    h = np.zeros((s, n_heads, head_dim, b.shape[-1]))
    states = np.zeros((s, t_len, *h.shape[1:]))
    y = np.zeros_like(x, dtype=np.float64)
    for t in range(t_len):
        h = decay[:, t, :, None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * b[:, t, None, None, :]
        states[:, t] = h
        y[:, t] = np.einsum("shpn,sn->shp", h, c[:, t]) + heads[1][None, :, None] * x[:, t]
    return y, states


def scan_chunked64(x, b, c, dt_raw, heads, chunk):
    """y of the same model in the SSD chunked form: within a chunk the quadratic (attention-like) form
    y_t = sum_{s <= t} (C_t . B_s) exp(l_t - l_s) dt_s x_s with l the running sum of dt A, plus the state carried
    in from the previous chunks read through exp(l_t) C_t; the chunk-end states are passed on."""
    a, dt, _ = _discretise(dt_raw, heads)
    s_len, t_len, n_heads, head_dim = x.shape
    state = np.zeros((s_len, n_heads, head_dim, b.shape[-1]))
    y = np.zeros_like(x, dtype=np.float64)
    for start in range(0, t_len, chunk):
        sl = slice(start, min(start + chunk, t_len))
        l_cum = np.cumsum(dt[:, sl] * a, axis=1)  # [S, L, H]
        seg = l_cum[:, :, None, :] - l_cum[:, None, :, :]  # [S, t, s, H]: l_t - l_s
        length = seg.shape[1]
        causal = np.tril(np.ones((length, length), bool))[None, :, :, None]
        weights = np.where(causal, np.exp(np.where(causal, seg, 0.0)), 0.0)  # [S, t, s, H]
        cb = np.einsum("stn,sun->stu", c[:, sl], b[:, sl])  # [S, t, s]
        u = dt[:, sl, :, None] * x[:, sl]  # [S, s, H, P]
        y[:, sl] = np.einsum("stu,stuh,suhp->sthp", cb, weights, u)
        y[:, sl] += np.exp(l_cum)[..., None] * np.einsum("stn,shpn->sthp", c[:, sl], state)
        to_end = np.exp(l_cum[:, -1:, :] - l_cum)  # [S, s, H]
        state = np.exp(l_cum[:, -1])[:, :, None, None] * state + np.einsum("suh,suhp,sun->shpn", to_end, u, b[:, sl])
    return y + heads[1][None, None, :, None] * x


def scan_backward64(x, b, c, dt_raw, heads, dy):
    """dx, dB, dC, d dt_raw, dheads [3, H] (d a_log, dD, d dt_bias) of L = sum(dy * y), by backpropagation through
    time over the stored states."""
    a, dt, decay = _discretise(dt_raw, heads)
    _, states = scan64(x, b, c, dt_raw, heads)
    t_len = x.shape[1]
    g = np.zeros_like(states[:, 0])
    dx, db, dc = np.zeros_like(x, np.float64), np.zeros_like(b, np.float64), np.zeros_like(c, np.float64)
    ddt = np.zeros_like(dt)
    d_a = np.zeros_like(a)
    for t in reversed(range(t_len)):
        nxt = decay[:, t + 1, :, None, None] if t + 1 < t_len else 0.0
        g = nxt * g + dy[:, t, :, :, None] * c[:, t, None, None, :]
        dc[:, t] = np.einsum("shp,shpn->sn", dy[:, t], states[:, t])
        gb = np.einsum("shpn,sn->shp", g, b[:, t])
        dx[:, t] = heads[1][None, :, None] * dy[:, t] + dt[:, t, :, None] * gb
        db[:, t] = np.einsum("sh,shpn,shp->sn", dt[:, t], g, x[:, t])
        prev = states[:, t - 1] if t > 0 else np.zeros_like(g)
        dlog_a = decay[:, t] * np.einsum("shpn,shpn->sh", g, prev)
        ddt[:, t] = np.einsum("shp,shp->sh", x[:, t], gb) + a * dlog_a
        d_a += np.sum(dt[:, t] * dlog_a, axis=0)
    d_raw = ddt * sigmoid64(dt_raw + heads[2])
    dheads = np.stack([a * d_a, np.einsum("sthp,sthp->h", dy, x), d_raw.sum(axis=(0, 1))])
    return dx, db, dc, d_raw, dheads


def block64(u, w_in, w_out, heads, seq_len, n_heads, head_dim, state_dim):
    """(out [R, F_out], zxbcdt, y [S, T, H, P]) of the block on u [R, F]: zxbcdt = u W_in, the scan, the gate
    y silu(z), out = gated W_out."""
    zxbcdt = np.asarray(u, np.float64) @ w_in
    z, x, b, c, dt_raw = split64(zxbcdt, seq_len, n_heads, head_dim, state_dim)
    y, _ = scan64(x, b, c, dt_raw, heads)
    gated = (y * z * sigmoid64(z)).reshape(u.shape[0], -1)
    return gated @ w_out, zxbcdt, y


def block_backward64(u, w_in, w_out, heads, dout, seq_len, n_heads, head_dim, state_dim):
    """du, dW_in, dW_out, dheads of L = sum(dout * out)."""
    zxbcdt = np.asarray(u, np.float64) @ w_in
    z, x, b, c, dt_raw = split64(zxbcdt, seq_len, n_heads, head_dim, state_dim)
    y, _ = scan64(x, b, c, dt_raw, heads)
    sg = sigmoid64(z)
    gated = (y * z * sg).reshape(u.shape[0], -1)
    dgated = (dout @ w_out.T).reshape(y.shape)
    dy = dgated * z * sg
    dz = dgated * y * sg * (1.0 + z * (1.0 - sg))
    dx, db, dc, d_raw, dheads = scan_backward64(x, b, c, dt_raw, heads, dy)
    rows = u.shape[0]
    dzx = np.concatenate([dz.reshape(rows, -1), dx.reshape(rows, -1), db.reshape(rows, -1), dc.reshape(rows, -1),
                          d_raw.reshape(rows, -1)], axis=1)
    return dzx @ w_in.T, u.T @ dzx, gated.T @ dout, dheads
