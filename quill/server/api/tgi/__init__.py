"""The text-generation-inference dialect: /generate, /generate_stream, / and /info (routes.py), and their request
schemas (schemas.py)."""
