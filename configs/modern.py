r"""A ModernBERT-style encoder of the default's size, trained on the default's data and schedule:

  python -m train --config=configs/modern.py --workdir=runs/modern

Pre-LN without the first layer's attention norm and with a final LayerNorm, rotary positions
(base 160,000 in the global layers, 10,000 in the local ones), global attention in every third
layer and a window of 32 positions (a token sees 16 either way) in the others, GeGLU, no
biases, GELU, LayerNorm eps 1e-5, a LayerNorm on the embeddings and no sqrt(d_model) scale;
d_ff 344 keeps the feed-forward parameters of the default's 512 (GeGLU's first matrix is
twice as wide). README, "From Hugging Face", compares it with the default.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.update(
      norm_position="pre", first_attention_norm=False, final_norm=True,
      position_embedding="rotary", rope_theta=160000.0, local_rope_theta=10000.0,
      local_attention=32, global_attention_every=3, glu=True, d_ff=344, dense_bias=False,
      norm_bias=False, activation="gelu", layer_norm_eps=1e-5, embedding_norm=True,
      embedding_scale=False)
  return config
