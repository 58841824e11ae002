// Translation unit that owns the precompiled header shared by dettrial's own tests and examples.
