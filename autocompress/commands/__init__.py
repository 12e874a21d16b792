"""CLI command modules, one per area; each exposes register(app)."""

MODEL_HELP = ("Model directory (Llama, Mistral, Qwen2, Qwen3 or compressed), a named teacher "
              "(`default`, `smollm2-135m`; see `autocompress teacher list`), a registered model "
              "(models:/NAME/VERSION) or a hub id "
              "(org/name, where a network exists).")
