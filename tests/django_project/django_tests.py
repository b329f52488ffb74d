"""A Django test case run by Django's own test runner (``python -m django test
django_project.django_tests``): the test database gets awa's schema from ``migrate``, and
a task enqueued inside the test's transaction is there to read back."""

from __future__ import annotations

from django.test import TestCase

from django_project import tasks


class EnqueueInDjangoTests(TestCase):
    def test_enqueue_in_a_test_database(self) -> None:
        result = tasks.add.enqueue(1, 2)
        fetched = tasks.add.get_result(result.id)
        assert str(fetched.status) == "READY"
        assert fetched.args == [1, 2]
