"""Route modules, one per resource; ``create_app`` mounts them under ``/api/v1``."""
