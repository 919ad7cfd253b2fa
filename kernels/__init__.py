"""Kernel sources, shipped as package data `autotune._kernels`."""
