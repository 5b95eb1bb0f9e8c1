"""The AI bot's shared state in Redis: ``streams`` (the answer so far, written by the worker,
read by the callback), ``pushes`` (messages the bot writes first) and ``uploads`` (images and
files the long connection uploads and sends)."""
