"""No models: the jobs are awa's own table. The module makes ``manage.py migrate`` send the
app's ``post_migrate`` signal, which applies awa's schema (``apps.py``)."""
