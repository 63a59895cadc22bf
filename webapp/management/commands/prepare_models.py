from django.core.management.base import BaseCommand

from trainer.models import default_model_path, is_checkpoint, minilm_path, prepare_default_models


class Command(BaseCommand):
    help = "Convert the packaged SmolLM2-135M-Instruct GGUF to safetensors once; locate MiniLM."

    def handle(self, *args, **options) -> None:
        if not is_checkpoint(default_model_path()):
            self.stdout.write("Converting SmolLM2-135M-Instruct from its GGUF file (once, ~30 s)...")
        self.stdout.write(f"actor/extractor model: {prepare_default_models()}")
        self.stdout.write(f"embedding model:       {minilm_path()}")
