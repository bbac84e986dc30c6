#!/bin/bash
echo green > /workspace/notes.txt
