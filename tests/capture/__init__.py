"""Tests of kiln/capture: the symbolic interpreter, guards, graph breaks, the API."""
