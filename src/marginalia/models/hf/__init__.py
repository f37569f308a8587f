"""The in-process transformers backend (`backend`) and its loaders: local Hugging Face folders, and GGUF files
through a converted safetensors cache (`loaders`)."""
