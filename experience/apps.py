from django.apps import AppConfig


class ExperienceConfig(AppConfig):
    name = "experience"
    verbose_name = "Experience bank"
