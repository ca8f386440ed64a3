from django.db import models


class Thing(models.Model):  # the model of the documentation's transactions example
    num = models.IntegerField()
