"""packlab's version, in a module of its own so any layer can name it without importing the
package facade (``packlab/__init__.py`` sits above everything)."""

__version__ = "0.1.0"
