"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), one class per concept.

Section numbers refer to the paper. Masks are boolean and ``True`` means "may attend".
Besides the training-time ``forward``, the model offers the two halves the exported graphs
need: ``encode_cross`` (encoder output projected once into every decoder layer's
cross-attention keys/values) and ``decode_step`` (one target position with a self-attention
key/value cache). ``training/export.py`` traces exactly these methods.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.config import PAD_ID, ModelConfig


def sinusoidal_table(max_positions: int, d_model: int, layout: str = "interleaved",
                     offset: int = 0) -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same).
    ``layout="halves"`` puts every sine first and every cosine after ([sin | cos]), as
    Marian does; "tensor2tensor" also spaces the wavelengths as tensor2tensor (and
    CTranslate2's built-in table) do; row p holds position p + ``offset``."""
    position = torch.arange(offset, offset + max_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, two_i / d_model)
    if layout == "tensor2tensor":  # tensor2tensor's timing signal: i / (d/2 - 1), not 2i / d
        angle = position / torch.pow(10000.0, two_i / 2 / (d_model // 2 - 1))
    if layout in ("halves", "tensor2tensor"):
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding of each token's position (§3.5), then dropout. A
    model with relative position representations (``max_relative_positions``) adds none: its
    self-attention knows the distances (``MultiHeadAttention``)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        table = sinusoidal_table(config.max_positions, config.d_model, config.position_layout,
                                 config.position_offset)
        if config.max_relative_positions:
            table = torch.zeros_like(table)
        self.register_buffer("table", table, persistent=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        if positions is None:
            return self.dropout(x + self.table[: x.size(1)])
        return self.dropout(x + self.table[positions])


class Embeddings(nn.Module):
    """Learned token embeddings multiplied by sqrt(d_model) (§3.4). One table is shared by
    source, target and the pre-softmax projection (the joint vocabulary makes this possible).
    Imported models may leave out the scale (``scale=False``)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int = PAD_ID,
                 scale: bool = True):
        super().__init__()
        self.lut = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model) if scale else 1.0
        nn.init.normal_(self.lut.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.lut.weight[pad_id].zero_()

    def forward(self, tokens: Tensor) -> Tensor:
        return self.lut(tokens) * self.scale


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Tensor:
    """§3.2.1: softmax(Q K^T / sqrt(d_k)) V. ``mask`` broadcasts to [batch, heads, q, k].

    Masked scores get the dtype's lowest value rather than -inf so that a row with nothing
    to attend to yields a uniform (finite) distribution instead of NaN."""
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1), value)


def relative_indices(distances: Tensor, max_relative: int) -> Tensor:
    """Rows of the relative tables for key-minus-query ``distances``, clipped at
    ``max_relative`` either way (Shaw et al., 2018)."""
    return distances.clamp(-max_relative, max_relative) + max_relative


class MultiHeadAttention(nn.Module):
    """§3.2.2: h parallel attention heads over learned projections, concatenated and projected.
    With ``max_relative`` > 0, self-attention with relative position representations (Shaw
    et al., 2018, as OpenNMT and CTranslate2 compute them): a learned key and value vector per
    clipped distance, added to each key's score (scaled as the keys are) and to the output."""

    def __init__(self, d_model: int, heads: int, dropout: float, max_relative: int = 0):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads, self.head_dim = heads, d_model // heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.max_relative = max_relative
        for linear in (self.w_q, self.w_k, self.w_v, self.w_o):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
        if max_relative:
            rows = 2 * max_relative + 1
            self.relative_keys = nn.Parameter(torch.randn(rows, self.head_dim) * 0.02)
            self.relative_values = nn.Parameter(torch.randn(rows, self.head_dim) * 0.02)

    def _relative_attention(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor,
                            distances: Tensor) -> Tensor:
        """``scaled_dot_product_attention`` plus the relative terms; ``distances`` (key
        position minus query position) is [q, k], or [batch, q, k] when rows differ."""
        index = relative_indices(distances, self.max_relative)
        if index.dim() == 2:
            index = index[None]
        rel_keys = self.relative_keys[index]  # [batch or 1, q, k, head_dim]
        rel_values = self.relative_values[index]
        scale = 1 / math.sqrt(query.size(-1))
        scores = torch.matmul(query, key.transpose(-2, -1))
        scores = scores + torch.matmul(query.unsqueeze(-2),
                                       rel_keys.transpose(-2, -1).unsqueeze(1)).squeeze(-2)
        scores = (scores * scale).masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        return torch.matmul(probs, value) + torch.matmul(
            probs.unsqueeze(-2), rel_values.unsqueeze(1)).squeeze(-2)

    def split_heads(self, x: Tensor) -> Tensor:
        """[batch, len, d_model] -> [batch, heads, len, head_dim]"""
        return x.view(x.size(0), x.size(1), self.heads, self.head_dim).transpose(1, 2)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Project ``memory`` into per-head keys and values; cacheable across decoding steps."""
        return self.split_heads(self.w_k(memory)), self.split_heads(self.w_v(memory))

    def attend(self, x: Tensor, key: Tensor, value: Tensor, mask: Tensor,
               distances: Tensor | None = None) -> Tensor:
        """Queries from ``x`` attend over already projected per-head ``key``/``value``;
        ``distances`` (key minus query positions) for relative positions, else the plain
        in-order ones."""
        query = self.split_heads(self.w_q(x))
        if self.max_relative:
            if distances is None:
                distances = (torch.arange(key.size(2), device=x.device)[None]
                             - torch.arange(x.size(1), device=x.device)[:, None])
            context = self._relative_attention(query, key, value, mask, distances)
        elif self.training and self.dropout > 0:
            # Attention dropout (§5.4 applies dropout to sub-layer outputs; fairseq and
            # tensor2tensor also drop attention weights). Fused kernel: same maths, faster.
            context = F.scaled_dot_product_attention(
                query, key, value, attn_mask=mask, dropout_p=self.dropout
            )
        else:
            context = scaled_dot_product_attention(query, key, value, mask)
        context = context.transpose(1, 2).reshape(x.size(0), x.size(1), -1)
        return self.w_o(context)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        key, value = self.keys_values(memory)
        return self.attend(x, key, value, mask)


ACTIVATIONS = {"relu": torch.relu, "gelu": F.gelu, "swish": F.silu}


class PositionwiseFeedForward(nn.Module):
    """§3.3: FFN(x) = max(0, x W1 + b1) W2 + b2 (imported models may use GELU or swish
    in place of max(0, .))."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]
        for linear in (self.w_1, self.w_2):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class AddNorm(nn.Module):
    """§3.1 / §5.4: LayerNorm(x + Dropout(Sublayer(x))) — or, with ``pre_norm``,
    x + Dropout(Sublayer(LayerNorm(x))), which trains more stably in deep stacks."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """§3.1: self-attention, then feed-forward, each wrapped in Add & Norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, p, eps = config.d_model, config.pre_norm, config.layer_norm_eps
        self.self_attn = MultiHeadAttention(d, config.heads, config.dropout,
                                            config.max_relative_positions)
        self.feed_forward = PositionwiseFeedForward(d, config.d_ff, config.dropout,
                                                    config.activation)
        self.sublayer = nn.ModuleList([AddNorm(d, config.dropout, p, eps) for _ in range(2)])

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, cross-attention over the encoder output, feed-forward."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, p, eps = config.d_model, config.pre_norm, config.layer_norm_eps
        self.self_attn = MultiHeadAttention(d, config.heads, config.dropout,
                                            config.max_relative_positions)
        self.cross_attn = MultiHeadAttention(d, config.heads, config.dropout)
        self.feed_forward = PositionwiseFeedForward(d, config.d_ff, config.dropout,
                                                    config.activation)
        self.sublayer = nn.ModuleList([AddNorm(d, config.dropout, p, eps) for _ in range(3)])

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, tgt_mask))
        x = self.sublayer[1](x, lambda y: self.cross_attn(y, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)

    def step(
        self,
        x: Tensor,
        self_key: Tensor,
        self_value: Tensor,
        self_mask: Tensor,
        cross_key: Tensor,
        cross_value: Tensor,
        src_mask: Tensor,
        distances: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One position ``x`` [batch, 1, d]; the cache holds earlier positions' keys/values.
        Returns the output and the cache extended by this position's key/value. ``distances``
        [batch, 1, past + 1]: each cached key's position minus the row's (relative
        positions only)."""
        new_key, new_value = self.self_attn.keys_values(
            self.sublayer[0].norm(x) if self.sublayer[0].pre_norm else x
        )
        key = torch.cat([self_key, new_key], dim=2)
        value = torch.cat([self_value, new_value], dim=2)
        x = self.sublayer[0](x, lambda y: self.self_attn.attend(y, key, value, self_mask,
                                                                distances))
        x = self.sublayer[1](
            x, lambda y: self.cross_attn.attend(y, cross_key, cross_value, src_mask)
        )
        return self.sublayer[2](x, self.feed_forward), key, value


class Transformer(nn.Module):
    """Encoder-decoder with tied embeddings and a linear + softmax generator (§3, §3.4).

    ``embeddings`` is the target's table (and the source's when shared); an imported model
    with separate vocabularies has ``source_embeddings`` too, and one with an untied output
    its own ``output_projection``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        d, pad, scale = config.d_model, config.pad_id, config.scale_embeddings
        self.embeddings = Embeddings(config.vocab_size, d, pad, scale)
        if not config.shared_embeddings:
            self.source_embeddings = Embeddings(config.src_vocab_size, d, pad, scale)
        if not config.tie_output:
            self.output_projection = nn.Linear(d, config.vocab_size, bias=False)
        if config.output_bias:
            self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.positional = PositionalEncoding(config)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(config) for _ in range(config.encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(config.decoder_layers)
        )
        # Pre-norm stacks need a final LayerNorm; post-norm outputs are already normalised.
        self.encoder_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.pre_norm
            else nn.Identity()
        )
        self.decoder_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.pre_norm
            else nn.Identity()
        )
        # Decoding must never emit padding or the start symbol; masking them in the step
        # (and so in the exported graph) keeps every search strategy from having to.
        never = torch.zeros(config.vocab_size, dtype=torch.bool)
        never[[config.pad_id, config.bos_id]] = True
        self.register_buffer("never_generate", never, persistent=False)

    # -- masks ------------------------------------------------------------------------------
    def padding_mask(self, tokens: Tensor) -> Tensor:
        """[batch, len] -> [batch, 1, 1, len]: True where a real token may be attended to."""
        return (tokens != self.config.pad_id)[:, None, None, :]

    @property
    def source_lut(self) -> Embeddings:
        return self.embeddings if self.config.shared_embeddings else self.source_embeddings

    def output_matrix(self) -> Tensor:
        """The pre-softmax projection [vocab, d_model]: the target embeddings when tied."""
        if self.config.tie_output:
            return self.embeddings.lut.weight
        return self.output_projection.weight

    @staticmethod
    def causal_mask(length: int, device: torch.device) -> Tensor:
        """[1, 1, len, len]: position i may attend to positions <= i (§3.2.3)."""
        return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]

    # -- training-time forward ---------------------------------------------------------------
    def encode(self, src_tokens: Tensor) -> tuple[Tensor, Tensor]:
        src_mask = self.padding_mask(src_tokens)
        x = self.positional(self.source_lut(src_tokens))
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def decode(self, tgt_tokens: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        tgt_mask = self.padding_mask(tgt_tokens) & self.causal_mask(
            tgt_tokens.size(1), tgt_tokens.device
        )
        x = self.positional(self.embeddings(tgt_tokens))
        for layer in self.decoder_layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.decoder_norm(x)

    def generator(self, x: Tensor) -> Tensor:
        """Pre-softmax linear transformation sharing the embedding matrix (§3.4); returns
        logits. The sqrt(d_model) scale belongs to the embedding lookup only."""
        bias = self.output_bias if self.config.output_bias else None
        return F.linear(x, self.output_matrix(), bias)

    def forward(self, src_tokens: Tensor, tgt_input: Tensor) -> Tensor:
        """Teacher forcing: logits [batch, tgt_len, vocab] for the next token at each position."""
        memory, src_mask = self.encode(src_tokens)
        return self.generator(self.decode(tgt_input, memory, src_mask))

    # -- incremental decoding (what the ONNX graphs compute) -----------------------------------
    def encode_cross(self, src_tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Run the encoder once and project its output into every decoder layer's
        cross-attention keys and values: [layers, batch, heads, src_len, head_dim] each."""
        memory, src_mask = self.encode(src_tokens)
        keys, values = zip(
            *(layer.cross_attn.keys_values(memory) for layer in self.decoder_layers), strict=True
        )
        return torch.stack(keys), torch.stack(values), src_mask[:, 0, 0, :]

    def decode_step(
        self,
        tokens: Tensor,
        positions: Tensor,
        self_keys: Tensor,
        self_values: Tensor,
        self_mask: Tensor,
        cross_keys: Tensor,
        cross_values: Tensor,
        src_mask: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One decoding step for a batch of rows that may be at different positions.

        tokens, positions: [batch]; self_keys/values: [layers, batch, heads, past, head_dim];
        self_mask: [batch, past + 1] (the last column is the current token); cross_*: as from
        ``encode_cross``; src_mask: [batch, src_len]. Returns log-probabilities [batch, vocab]
        and the present cache, the past plus this step [layers, batch, heads, past + 1, head_dim],
        to feed back at the next step."""
        x = self.positional(self.embeddings(tokens[:, None]), positions[:, None])
        self_mask4 = self_mask[:, None, None, :]
        src_mask4 = src_mask[:, None, None, :]
        # Cached column c holds position c; the last column, this step, the row's position.
        past = self_keys.size(3)
        key_positions = torch.cat([torch.arange(past, device=tokens.device).expand(
            tokens.size(0), past), positions[:, None]], dim=1)
        distances = (key_positions - positions[:, None])[:, None, :]
        present_keys, present_values = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, key, value = layer.step(
                x,
                self_keys[i],
                self_values[i],
                self_mask4,
                cross_keys[i],
                cross_values[i],
                src_mask4,
                distances,
            )
            present_keys.append(key)
            present_values.append(value)
        logits = self.generator(self.decoder_norm(x))[:, 0].float()
        logits = logits.masked_fill(self.never_generate, torch.finfo(logits.dtype).min)
        return (
            torch.log_softmax(logits, dim=-1),
            torch.stack(present_keys),
            torch.stack(present_values),
        )

    @torch.no_grad()
    def greedy_decode(
        self, src_tokens: Tensor, max_length: int, bos_id: int, eos_id: int
    ) -> list[list[int]]:
        """Greedy search with the key/value cache; used for validation BLEU during training.
        Returns token ids without BOS/EOS."""
        batch = src_tokens.size(0)
        cross_keys, cross_values, src_mask = self.encode_cross(src_tokens)
        layers, _, heads, _, head_dim = cross_keys.shape
        self_keys = cross_keys.new_zeros(layers, batch, heads, 0, head_dim)
        self_values = self_keys
        tokens = torch.full((batch,), bos_id, dtype=torch.long, device=src_tokens.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=src_tokens.device)
        output: list[Tensor] = []
        limit = min(max_length, self.config.max_positions - 1)
        for step in range(limit):
            positions = torch.full_like(tokens, step)
            self_mask = torch.ones(batch, step + 1, dtype=torch.bool, device=tokens.device)
            log_probs, k, v = self.decode_step(
                tokens,
                positions,
                self_keys,
                self_values,
                self_mask,
                cross_keys,
                cross_values,
                src_mask,
            )
            self_keys, self_values = k, v
            tokens = log_probs.argmax(-1).masked_fill(finished, eos_id)
            output.append(tokens)
            finished |= tokens == eos_id
            if bool(finished.all()):
                break
        result = []
        for row in torch.stack(output, dim=1).tolist() if output else [[] for _ in range(batch)]:
            result.append(row[: row.index(eos_id)] if eos_id in row else row)
        return result
