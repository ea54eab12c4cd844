"""The built-in tiny bases (`builtin:tiny-gpt-oss`, its MXFP4 and tools variants, tiny Qwen3 and the record-less
tiny Llama and Gemma): seeded, pre-trained once per machine on a generated corpus, cached by their recipe. What the
quickstart trains; nothing else in the package imports them but model loading, which builds one when it is named."""
