"""Placeholder router; filled in by its own change."""

from fastapi import APIRouter

router = APIRouter()
