# docs/topics/tasks.txt (Django 6.0), "Enqueueing Tasks": JSON arguments. `process_data` is named but
# not shown there; double_dictionary is as the documentation has it.
from django.tasks import task


@task()
def process_data(data):
    return data


@task()
def double_dictionary(key):
    return {key: key * 2}
