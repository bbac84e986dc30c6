#!/bin/bash
echo sugar > /workspace/idea.txt
