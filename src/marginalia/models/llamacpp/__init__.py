"""The in-process llama.cpp backend (`backend`), the embedded model's weights as Q8_0 (`gguf_copy`), LoRA
adapters written as GGUF (`lora_gguf`) and the command that serves a GGUF model over llama-cpp-python's
OpenAI-compatible server (`server`)."""
