"""The OpenAI dialect, as vLLM serves it: /v1/completions and /v1/models (completions.py), /v1/chat/completions with
chat templates and tool calls (chat.py, chat_prompt.py, chat_tools.py, tool_calls/; the same route is TGI's
Messages API), vLLM's /tokenize and /detokenize (tokenize.py) and /tokenizer_info (tokenizer_info.py), and each one's
request schema."""
