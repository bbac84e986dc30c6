#!/bin/bash
echo sugar > /workspace/todo.txt
