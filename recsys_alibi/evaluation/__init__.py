"""Offline full-catalog ranking evaluation."""
