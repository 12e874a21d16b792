"""CLI command modules, one per area; each exposes register(app)."""

MODEL_HELP = "Model directory (Llama, Mistral, Qwen2, Qwen3 or compressed), or `default`."
