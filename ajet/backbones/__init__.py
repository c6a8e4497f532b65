"""Backbones turn packed samples into weight updates: debug (in-process), trinity, verl."""
