"""The LibreTranslate dialect, served by the hosted encoder-decoder (translation) models: /translate, /languages,
/detect and /frontend/settings (routes.py), and its request fields and language codes (schemas.py)."""
