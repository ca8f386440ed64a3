# docs/topics/tasks.txt (Django 6.0), "Transactions", unchanged.
from django.tasks import task

from .models import Thing


@task
def my_task(thing_num):
    Thing.objects.get(num=thing_num)
