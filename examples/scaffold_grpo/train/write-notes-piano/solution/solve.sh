#!/bin/bash
echo piano > /workspace/notes.txt
