"""Fused Triton kernels for the per-row and per-token work nGPT, TokenFormer, mHC and AttnRes add, each a drop-in
for a plugin's eager path, kept only where a device-time measurement shows it beating compiled torch.

One file per fused op, each a ``torch.library`` custom op (fake and autograd registered, so torch.compile keeps
it whole as one opaque node) with a hand-written backward op:

- ``row_l2_normalize``: x / max(|x|, eps) over the last dim (nGPT's normalisation of sublayer outputs, the stream
  and the embedding);
- ``qk_normalize``: nGPT's per-head q <- s_qk^2 * q/|q|, k <- k/|k|;
- ``ngpt_stream_update``: h <- Norm(lerp(h, Norm(branch), |alpha|)) in one pass;
- ``pattention_theta``: TokenFormer's Θ, GeLU(A / |A| * sqrt(n)) over each row of scores;
- ``sinkhorn_knopp``: mHC's Sinkhorn-Knopp projection, every iteration of a token's n x n matrix in registers;
- ``depth_softmax``: AttnRes's softmax over depth and weighted sum of the sources, per token.

Plugins choose them with their ``kernel`` option (``auto``, ``triton``, ``torch``); ``dispatch`` holds the rule,
``measured`` the data ``auto`` decides from. triton is optional: nothing here imports it unless it is installed,
and without it ``kernel: triton`` is a one-line error while ``auto`` stays on torch. Pure PyTorch + Triton: no
Lightning here.
"""
