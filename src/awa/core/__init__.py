"""The core: argument checks, kinds, extras, outages, leader duties; imports model, sql, errors."""
