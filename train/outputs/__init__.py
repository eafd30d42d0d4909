"""What a run gives out: predictions (predict), weights and programs (export, hf_export) and
attention drawings (draw_attention)."""
