"""Where an engine runs: a thread of the server (async_engine.py) or a process of its own (process_engine.py,
core_process.py, over wire.py's messages), behind the frontend that routes talk to (frontend.py)."""
